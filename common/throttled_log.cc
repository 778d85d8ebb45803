#include "common/throttled_log.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace longhaul::common {

bool ThrottledLog::Warn(const std::string& key, const std::string& msg) {
  const absl::Time now = clock_->Now();
  int64_t suppressed = 0;
  {
    absl::MutexLock l(&mu_);
    auto it = keys_.find(key);
    if (it == keys_.end()) {
      // Past the bound, keys not logged within `every` are forgotten (one sweep per `every`); if
      // none is, the new key shares the overflow entry.
      if (keys_.size() >= kMaxKeys && now - swept_ >= every_) {
        swept_ = now;
        for (auto k = keys_.begin(); k != keys_.end();) {
          k = now - k->second.logged >= every_ && k->second.suppressed == 0 ? keys_.erase(k) : std::next(k);
        }
      }
      it = keys_.size() >= kMaxKeys ? keys_.try_emplace("(other keys)").first : keys_.try_emplace(key).first;
    }
    Entry& e = it->second;
    if (now - e.logged < every_) {
      ++e.suppressed;
      return false;
    }
    suppressed = e.suppressed;
    e.logged = now;
    e.suppressed = 0;
  }
  LogWarning(who_, suppressed > 0 ? absl::StrCat(msg, " (", suppressed, " more since the last report)") : msg);
  return true;
}

}  // namespace longhaul::common
