#include "coordinator/job_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "codec/spec.h"
#include "proto/link_spec.h"
#include "stage_runtime/model_presets.h"
#include "stage_runtime/partition.h"

namespace longhaul::coordinator {

v1::JobSpec DefaultJobSpec() {
  v1::JobSpec s;
  s.set_name("job");
  v1::ModelSpec* m = s.mutable_model();
  m->set_layers(4);
  m->set_hidden(128);
  m->set_heads(4);
  m->set_context(64);
  m->set_vocab(256);
  s.set_stages(4);
  s.set_schedule("1f1b");
  s.set_micro_batches(4);
  s.set_micro_batch_size(8);
  s.set_forward_codec("tahquant");
  s.set_backward_codec("int8");
  v1::OptimizerSpec* o = s.mutable_optimizer();
  o->set_lr(3e-3);
  o->set_min_lr(3e-4);
  o->set_warmup_steps(20);
  o->set_beta1(0.9);
  o->set_beta2(0.95);
  o->set_eps(1e-8);
  o->set_weight_decay(0.1);
  o->set_clip_norm(1.0);
  s.set_steps(300);
  s.set_seed(1);
  // Bounds what a failure costs (docs/recovery.md): at most this many steps are re-run.
  s.set_checkpoint_interval(50);
  s.set_checkpoint_replicate("peer");
  s.mutable_recovery()->set_max_restarts(10);
  s.mutable_recovery()->set_wait_seconds(600);
  // The progress watchdog (docs/recovery.md): steps vary by a few times (checkpoint copies, a slow
  // link's retransmits, the scheduler of a shared host), a hang does not end; the floor keeps
  // millisecond steps from tripping on a pause of the process (allocation, swap).
  s.mutable_recovery()->set_progress_timeout_factor(10);
  s.mutable_recovery()->set_progress_timeout_min_seconds(60);
  // Building a stage and restoring it may fetch gigabytes over a slow link (a 4.5 GB gpt2-xl stage
  // takes 6 minutes at 100 Mbit/s).
  s.mutable_recovery()->set_startup_timeout_seconds(1800);
  s.mutable_recovery()->set_straggler_factor(3);
  s.set_data_dir("/usr/share/games/fortunes");
  s.set_val_fraction(0.1);
  s.set_codec_threads(1);
  s.set_precision("fp32");
  s.set_data_format("text");
  s.mutable_links()->set_codec_device("auto");
  s.set_replicas(1);
  s.mutable_data_parallel()->set_codec("fp32");
  // A synchronisation moves a stage's whole gradient; over a slow WAN link that is minutes for a
  // large stage, while a dead replica is found by the pings after the deadline (collective/group.h).
  s.mutable_data_parallel()->set_timeout_seconds(120);
  s.mutable_data_parallel()->set_weight_bits(4);
  return s;
}

namespace {

// Walks one YAML mapping: each known key has a handler; unknown keys and conversion failures
// become problems with their dotted path and line number.
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string path, std::vector<std::string>* problems)
      : node_(node), path_(std::move(path)), problems_(problems) {}

  template <typename T, typename Set>
  MapReader& Field(const std::string& key, Set set) {
    known_.push_back(key);
    const YAML::Node v = node_[key];
    if (!v) return *this;
    if (!v.IsScalar()) {
      Problem(key, v, "must be a single value");
      return *this;
    }
    try {
      set(v.as<T>());
    } catch (const YAML::Exception&) {
      Problem(key, v, absl::StrCat("\"", v.Scalar(), "\" is not ", TypeName<T>()));
    }
    return *this;
  }

  // A single value, or a list of them (`replicas: 2` or `replicas: [2, 1]`).
  template <typename T, typename SetOne, typename SetList>
  MapReader& ScalarOrList(const std::string& key, SetOne one, SetList list) {
    const YAML::Node v = node_[key];
    if (!v || !v.IsSequence()) return Field<T>(key, one);
    known_.push_back(key);
    std::vector<T> values;
    for (const YAML::Node& e : v) {
      bool ok = e.IsScalar();
      T x{};
      if (ok) {
        try {
          x = e.as<T>();
        } catch (const YAML::Exception&) {
          ok = false;
        }
      }
      if (!ok) {
        Problem(key, e, absl::StrCat("every entry must be ", TypeName<T>(), " (",
                                     e.IsScalar() ? absl::StrCat("\"", e.Scalar(), "\"") : "a nested value", " is not)"));
        return *this;
      }
      values.push_back(x);
    }
    list(std::move(values));
    return *this;
  }

  MapReader& Map(const std::string& key, const std::function<void(MapReader&)>& fn) {
    known_.push_back(key);
    const YAML::Node v = node_[key];
    if (!v) return *this;
    if (!v.IsMap()) {
      Problem(key, v, "must be a mapping");
      return *this;
    }
    MapReader sub(v, Path(key), problems_);
    fn(sub);
    sub.CheckUnknown();
    return *this;
  }

  void CheckUnknown() {
    for (const auto& kv : node_) {
      const std::string k = kv.first.as<std::string>("");
      if (std::find(known_.begin(), known_.end(), k) == known_.end()) {
        Problem(k, kv.first, absl::StrCat("unknown key (known here: ", absl::StrJoin(known_, ", "), ")"));
      }
    }
  }

 private:
  template <typename T>
  static const char* TypeName() {
    if constexpr (std::is_same_v<T, std::string>) return "a string";
    else if constexpr (std::is_floating_point_v<T>) return "a number";
    else return "an integer";
  }
  std::string Path(const std::string& key) const { return path_.empty() ? key : absl::StrCat(path_, ".", key); }
  void Problem(const std::string& key, const YAML::Node& at, const std::string& what) {
    problems_->push_back(absl::StrCat(Path(key), " (line ", at.Mark().line + 1, "): ", what));
  }

  const YAML::Node& node_;
  std::string path_;
  std::vector<std::string>* problems_;
  std::vector<std::string> known_;
};

}  // namespace

absl::Status CheckSpecText(const std::string& text) {
  auto refuse = [&](size_t at, const char* what) {
    return absl::InvalidArgumentError(absl::StrCat("job spec is not text (", what, ": byte 0x",
                                                   absl::Hex(static_cast<uint8_t>(text[at]), absl::kZeroPad2),
                                                   " at offset ", at, "); a job spec is a YAML file"));
  };
  const auto* b = reinterpret_cast<const uint8_t*>(text.data());
  for (size_t i = 0, n = text.size(); i < n;) {
    const uint8_t c = b[i];
    if (c < 0x80) {
      if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7F) return refuse(i, "a control character");
      ++i;
      continue;
    }
    // A UTF-8 sequence: its length from the lead byte, no overlong forms, no surrogates, <= U+10FFFF.
    int len = 0;
    uint32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return refuse(i, "not UTF-8");
    if (n - i < static_cast<size_t>(len)) return refuse(i, "not UTF-8");
    for (int k = 1; k < len; ++k) {
      if ((b[i + k] & 0xC0) != 0x80) return refuse(i, "not UTF-8");
      cp = cp << 6 | (b[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return refuse(i, "not UTF-8");
    i += len;
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::JobSpec> ParseJobSpec(const std::string& yaml, int64_t steps_override) {
  if (yaml.size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job spec is ", yaml.size(), " bytes; the limit is ", kMaxSpecBytes));
  }
  if (absl::Status s = CheckSpecText(yaml); !s.ok()) return s;
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(absl::StrCat("job spec is not valid YAML: line ", e.mark.line + 1, ", column ",
                                                   e.mark.column + 1, ": ", e.msg));
  }
  if (!root.IsMap()) return absl::InvalidArgumentError("job spec must be a YAML mapping (key: value lines)");

  v1::JobSpec s = DefaultJobSpec();
  std::vector<std::string> problems;
  std::string optimizer_name = "adamw";
  MapReader top(root, "", &problems);
  top.Field<std::string>("name", [&](std::string v) { s.set_name(v); })
      .Map("model", [&](MapReader& m) {
        v1::ModelSpec* ms = s.mutable_model();
        // A preset first sets every size; sizes given next to it override its values.
        m.Field<std::string>("preset", [&](std::string v) {
           const stage_runtime::ModelPreset* p = stage_runtime::FindModelPreset(v);
           if (p == nullptr) {
             problems.push_back(absl::StrCat("model.preset: \"", v, "\" is not one of ", stage_runtime::ModelPresetNames()));
             return;
           }
           ms->set_preset(v);
           ms->set_layers(p->layers);
           ms->set_hidden(p->hidden);
           ms->set_heads(p->heads);
           ms->set_context(p->context);
           ms->set_vocab(p->vocab);
         })
            .Field<int>("layers", [&](int v) { ms->set_layers(v); })
            .Field<int>("hidden", [&](int v) { ms->set_hidden(v); })
            .Field<int>("heads", [&](int v) { ms->set_heads(v); })
            .Field<int>("context", [&](int v) { ms->set_context(v); })
            .Field<int>("vocab", [&](int v) { ms->set_vocab(v); });
      })
      .Field<int>("stages", [&](int v) { s.set_stages(v); })
      .Field<std::string>("schedule", [&](std::string v) { s.set_schedule(v); })
      .Field<int>("micro_batches", [&](int v) { s.set_micro_batches(v); })
      .Field<int>("micro_batch_size", [&](int v) { s.set_micro_batch_size(v); })
      .Map("codecs", [&](MapReader& m) {
        m.Field<std::string>("forward", [&](std::string v) { s.set_forward_codec(v); })
            .Field<std::string>("backward", [&](std::string v) { s.set_backward_codec(v); });
      })
      .Map("optimizer", [&](MapReader& m) {
        v1::OptimizerSpec* o = s.mutable_optimizer();
        m.Field<std::string>("name", [&](std::string v) { optimizer_name = v; })
            .Field<double>("lr", [&](double v) { o->set_lr(v); })
            .Field<double>("min_lr", [&](double v) { o->set_min_lr(v); })
            .Field<int>("warmup_steps", [&](int v) { o->set_warmup_steps(v); })
            .Field<double>("beta1", [&](double v) { o->set_beta1(v); })
            .Field<double>("beta2", [&](double v) { o->set_beta2(v); })
            .Field<double>("eps", [&](double v) { o->set_eps(v); })
            .Field<double>("weight_decay", [&](double v) { o->set_weight_decay(v); })
            .Field<double>("clip_norm", [&](double v) { o->set_clip_norm(v); });
      })
      .Field<int64_t>("steps", [&](int64_t v) { s.set_steps(v); })
      .Field<uint64_t>("seed", [&](uint64_t v) { s.set_seed(v); })
      .Map("checkpoint", [&](MapReader& m) {
        m.Field<int64_t>("interval", [&](int64_t v) { s.set_checkpoint_interval(v); })
            .Field<std::string>("dir", [&](std::string v) { s.set_checkpoint_dir(v); })
            .Field<std::string>("replicate", [&](std::string v) { s.set_checkpoint_replicate(v); });
      })
      .Map("recovery", [&](MapReader& m) {
        v1::RecoverySpec* r = s.mutable_recovery();
        // A duration: seconds as a plain number, or absl's form (90s, 10m, 1h30m).
        auto duration = [&](const char* key, void (v1::RecoverySpec::*set)(double)) {
          return [&problems, r, key, set](std::string v) {
            double seconds = 0;
            absl::Duration d;
            if (absl::SimpleAtod(v, &seconds)) {
              (r->*set)(seconds);
            } else if (absl::ParseDuration(v, &d)) {
              (r->*set)(absl::ToDoubleSeconds(d));
            } else {
              problems.push_back(absl::StrCat("recovery.", key, ": \"", v, "\" is not a duration (0, 90s, 10m)"));
            }
          };
        };
        m.Field<int>("max_restarts", [&](int v) { r->set_max_restarts(v); })
            .Field<std::string>("wait", duration("wait", &v1::RecoverySpec::set_wait_seconds))
            .Field<double>("progress_timeout_factor", [&](double v) { r->set_progress_timeout_factor(v); })
            .Field<std::string>("progress_timeout_min",
                                duration("progress_timeout_min", &v1::RecoverySpec::set_progress_timeout_min_seconds))
            .Field<std::string>("startup_timeout",
                                duration("startup_timeout", &v1::RecoverySpec::set_startup_timeout_seconds))
            .Field<double>("straggler_factor", [&](double v) { r->set_straggler_factor(v); });
      })
      .Map("data", [&](MapReader& m) {
        m.Field<std::string>("format", [&](std::string v) { s.set_data_format(v); })
            .Field<std::string>("corpus", [&](std::string v) { s.set_data_dir(v); })
            .Field<double>("val_fraction", [&](double v) { s.set_val_fraction(v); });
      })
      .Map("links", [&](MapReader& m) {
        v1::LinkSpec* l = s.mutable_links();
        m.Field<double>("rate_mbit", [&](double v) { l->set_rate_mbit(v); })
            .Field<double>("between_regions_mbit", [&](double v) { l->set_between_regions_mbit(v); })
            .Field<double>("pace_mbit", [&](double v) { l->set_pace_mbit(v); })
            .Field<int64_t>("burst_bytes", [&](int64_t v) { l->set_burst_bytes(v); })
            .Field<double>("delay_ms", [&](double v) { l->set_delay_ms(v); })
            .Field<double>("jitter_ms", [&](double v) { l->set_jitter_ms(v); })
            .Field<double>("loss", [&](double v) { l->set_loss(v); })
            .Field<double>("retransmit_ms", [&](double v) { l->set_retransmit_ms(v); })
            .Field<int>("streams", [&](int v) { l->set_streams(v); })
            .Field<std::string>("codec_device", [&](std::string v) { l->set_codec_device(v); });
      })
      .Field<int>("codec_threads", [&](int v) { s.set_codec_threads(v); })
      .ScalarOrList<int>("replicas", [&](int v) { s.set_replicas(v); },
                         [&](std::vector<int> v) {
                           if (v.empty()) problems.push_back("replicas: an empty list (a count per stage, or one count)");
                           s.set_replicas(0);
                           for (int n : v) s.add_stage_replicas(n);
                         })
      .Map("data_parallel", [&](MapReader& m) {
        v1::DataParallelSpec* d = s.mutable_data_parallel();
        m.Field<std::string>("codec", [&](std::string v) { d->set_codec(v); })
            .Field<std::string>("timeout", [&problems, d](std::string v) {
              double seconds = 0;
              absl::Duration t;
              if (absl::SimpleAtod(v, &seconds)) {
                d->set_timeout_seconds(seconds);
              } else if (absl::ParseDuration(v, &t)) {
                d->set_timeout_seconds(absl::ToDoubleSeconds(t));
              } else {
                problems.push_back(absl::StrCat("data_parallel.timeout: \"", v, "\" is not a duration (90s, 10m)"));
              }
            })
            .Field<int>("weight_bits", [&](int v) { d->set_weight_bits(v); });
      })
      .Field<std::string>("precision", [&](std::string v) { s.set_precision(v); });
  top.CheckUnknown();
  if (optimizer_name != "adamw") problems.push_back(absl::StrCat("optimizer.name: \"", optimizer_name, "\" is not supported (adamw)"));
  if (steps_override > 0) s.set_steps(steps_override);

  absl::Status v = ValidateJobSpec(s);
  if (!v.ok()) problems.push_back(std::string(v.message()));
  if (!problems.empty()) {
    return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
  }
  return s;
}

absl::Status ValidateJobSpec(const v1::JobSpec& s) {
  std::vector<std::string> p;
  auto range = [&](const char* name, double v, double lo, double hi) {
    if (!(v >= lo && v <= hi)) p.push_back(absl::StrCat(name, ": ", v, " is out of range [", lo, ", ", hi, "]"));
  };
  const v1::ModelSpec& m = s.model();
  range("model.layers", m.layers(), 1, 1024);
  range("model.hidden", m.hidden(), 8, 65536);
  range("model.heads", m.heads(), 1, 1024);
  range("model.context", m.context(), 2, 65536);
  if (m.heads() > 0 && m.hidden() % m.heads() != 0) {
    p.push_back(absl::StrCat("model.hidden: ", m.hidden(), " is not divisible by model.heads (", m.heads(), ")"));
  }
  if (s.data_format() == "text") {
    if (m.vocab() < 256) p.push_back(absl::StrCat("model.vocab: ", m.vocab(), " (byte-level text needs at least 256)"));
  } else if (s.data_format() == "tokens-u16") {
    range("model.vocab", m.vocab(), 1, 65536);  // every token is checked against it on the workers
  } else {
    p.push_back(absl::StrCat("data.format: \"", s.data_format(), "\" is not text or tokens-u16"));
  }
  if (s.precision() != "fp32" && s.precision() != "bf16") {
    p.push_back(absl::StrCat("precision: \"", s.precision(), "\" is not fp32 or bf16"));
  }
  range("stages", s.stages(), 1, 1024);
  if (s.stages() > m.layers() && m.layers() >= 1) {
    p.push_back(absl::StrCat("stages: ", s.stages(), " stages need at least as many layers (model.layers is ", m.layers(), ")"));
  }
  if (s.schedule() != "1f1b" && s.schedule() != "gpipe") {
    p.push_back(absl::StrCat("schedule: \"", s.schedule(), "\" is not 1f1b or gpipe"));
  }
  range("micro_batches", s.micro_batches(), 1, 4096);
  range("micro_batch_size", s.micro_batch_size(), 1, 65536);
  for (const auto& [name, spec] : {std::pair<const char*, std::string>{"codecs.forward", s.forward_codec()},
                                   {"codecs.backward", s.backward_codec()}}) {
    // The workers build their codecs from the same parser (codec::MakeCodec), so a spec accepted
    // here is one every worker accepts.
    absl::StatusOr<codec::CodecSpec> c = codec::ParseCodecSpec(spec);
    if (!c.ok()) p.push_back(absl::StrCat(name, ": ", c.status().message()));
  }
  const v1::OptimizerSpec& o = s.optimizer();
  if (!(o.lr() > 0 && o.lr() <= 10)) p.push_back(absl::StrCat("optimizer.lr: ", o.lr(), " must be in (0, 10]"));
  if (!(o.min_lr() >= 0 && o.min_lr() <= o.lr())) p.push_back(absl::StrCat("optimizer.min_lr: ", o.min_lr(), " must be in [0, lr]"));
  range("optimizer.warmup_steps", o.warmup_steps(), 0, 1e9);
  if (!(o.beta1() >= 0 && o.beta1() < 1)) p.push_back(absl::StrCat("optimizer.beta1: ", o.beta1(), " must be in [0, 1)"));
  if (!(o.beta2() >= 0 && o.beta2() < 1)) p.push_back(absl::StrCat("optimizer.beta2: ", o.beta2(), " must be in [0, 1)"));
  if (!(o.eps() > 0)) p.push_back(absl::StrCat("optimizer.eps: ", o.eps(), " must be > 0"));
  range("optimizer.weight_decay", o.weight_decay(), 0, 10);
  if (!std::isfinite(o.clip_norm())) p.push_back("optimizer.clip_norm: must be finite (<= 0 disables clipping)");
  range("steps", static_cast<double>(s.steps()), 1, 1e9);
  range("checkpoint.interval", static_cast<double>(s.checkpoint_interval()), 0, 1e9);
  if (s.checkpoint_replicate() != "peer" && s.checkpoint_replicate() != "none") {
    p.push_back(absl::StrCat("checkpoint.replicate: \"", s.checkpoint_replicate(), "\" is not peer or none",
                             s.checkpoint_replicate() == "coordinator" ? " (coordinator is not implemented yet)" : ""));
  }
  range("recovery.max_restarts", s.recovery().max_restarts(), 0, 1e6);
  range("recovery.wait", s.recovery().wait_seconds(), 0, 1e7);
  const v1::RecoverySpec& rs = s.recovery();
  // Below 2 the watchdog would take an ordinary slow step (twice the median) for a hang.
  if (rs.progress_timeout_factor() != 0 && !(rs.progress_timeout_factor() >= 2 && rs.progress_timeout_factor() <= 1e4)) {
    p.push_back(absl::StrCat("recovery.progress_timeout_factor: ", rs.progress_timeout_factor(),
                             " must be 0 (no watchdog) or in [2, 10000]"));
  }
  // The watchdog sees stages through heartbeats (every second by default): a shorter floor only
  // measures their jitter.
  if (!(rs.progress_timeout_min_seconds() >= 1 && rs.progress_timeout_min_seconds() <= 1e7)) {
    p.push_back(absl::StrCat("recovery.progress_timeout_min: ", rs.progress_timeout_min_seconds(),
                             "s must be in [1s, 1e7s]"));
  }
  if (!(rs.startup_timeout_seconds() >= 1 && rs.startup_timeout_seconds() <= 1e7)) {
    p.push_back(absl::StrCat("recovery.startup_timeout: ", rs.startup_timeout_seconds(), "s must be in [1s, 1e7s]"));
  }
  if (rs.straggler_factor() != 0 && !(rs.straggler_factor() > 1 && rs.straggler_factor() <= 1e4)) {
    p.push_back(absl::StrCat("recovery.straggler_factor: ", rs.straggler_factor(),
                             " must be 0 (not flagged) or in (1, 10000]"));
  }
  if (!(s.val_fraction() > 0 && s.val_fraction() < 1)) {
    p.push_back(absl::StrCat("data.val_fraction: ", s.val_fraction(), " must be in (0, 1)"));
  }
  if (s.data_dir().empty()) p.push_back("data.corpus: must name a file or directory on the workers");
  range("links.rate_mbit", s.links().rate_mbit(), 0, 1e6);
  range("links.between_regions_mbit", s.links().between_regions_mbit(), 0, 1e6);
  range("links.pace_mbit", s.links().pace_mbit(), 0, 1e6);
  if (const v1::LinkSpec& l = s.links(); l.pace_mbit() > 0 && EmulatesLink(l)) {
    p.push_back(absl::StrCat("links.pace_mbit: ", l.pace_mbit(),
                             " paces real links; not with in-process emulation (rate_mbit, delay_ms, jitter_ms, loss)"));
  }
  range("links.burst_bytes", static_cast<double>(s.links().burst_bytes()), 0, 1 << 30);
  range("links.delay_ms", s.links().delay_ms(), 0, 60000);
  range("links.jitter_ms", s.links().jitter_ms(), 0, 60000);
  if (s.links().jitter_ms() > s.links().delay_ms()) {
    p.push_back(absl::StrCat("links.jitter_ms: ", s.links().jitter_ms(), " exceeds links.delay_ms (", s.links().delay_ms(), ")"));
  }
  range("links.loss", s.links().loss(), 0, 0.5);
  range("links.retransmit_ms", s.links().retransmit_ms(), 0, 60000);
  range("links.streams", s.links().streams(), 0, 8);
  // "" is the default, auto.
  if (const std::string& d = s.links().codec_device(); !d.empty()) {
    if (!codec::ParseCodecDevice(d).ok()) {
      p.push_back(absl::StrCat("links.codec_device: \"", d, "\" is not auto, cpu or gpu"));
    }
  }
  range("codec_threads", s.codec_threads(), 1, 64);
  // Replicated stages: 0 is the default of specs built in code (one replica).
  if (s.stage_replicas_size() > 0) {
    if (s.replicas() > 1) p.push_back("replicas: both a count and a per-stage list");
    if (s.stages() >= 1 && s.stage_replicas_size() != s.stages()) {
      p.push_back(absl::StrCat("replicas: a list of ", s.stage_replicas_size(), " counts for ", s.stages(),
                               " stages (one per stage)"));
    }
    for (int i = 0; i < s.stage_replicas_size(); ++i) {
      const int n = s.stage_replicas(i);
      if (n < 1 || n > kMaxReplicas) {
        p.push_back(absl::StrCat("replicas[", i, "]: ", n, " is out of range [1, ", kMaxReplicas, "]"));
      } else if (s.micro_batches() >= 1 && s.micro_batches() % n != 0) {
        p.push_back(absl::StrCat("micro_batches: ", s.micro_batches(), " is not a multiple of replicas[", i, "] (", n,
                                 "): each replica of stage ", i, " takes micro_batches / ", n, " of every step"));
      }
    }
  } else {
    if (s.replicas() != 0) range("replicas", s.replicas(), 1, kMaxReplicas);
    if (s.replicas() > 1 && s.micro_batches() >= 1 && s.micro_batches() % s.replicas() != 0) {
      p.push_back(absl::StrCat("micro_batches: ", s.micro_batches(), " is not a multiple of replicas (", s.replicas(),
                               "): each replica takes micro_batches / replicas of every step"));
    }
  }
  const v1::DataParallelSpec& dp = s.data_parallel();
  if (const std::string& c = dp.codec();
      !c.empty() && c != "fp32" && c != "sdp4bit" && c != "zeropp" && c != "bitdp1" && c != "bitdp2") {
    p.push_back(absl::StrCat("data_parallel.codec: \"", c, "\" is not fp32, sdp4bit, bitdp1, bitdp2 or zeropp"));
  }
  if (dp.timeout_seconds() != 0) range("data_parallel.timeout", dp.timeout_seconds(), 1, 86400);
  if (dp.weight_bits() != 0 && dp.weight_bits() != 4 && dp.weight_bits() != 8) {
    p.push_back(absl::StrCat("data_parallel.weight_bits: ", dp.weight_bits(), " is not 4 or 8"));
  }
  if (s.name().empty() || s.name().size() > 128) p.push_back("name: must be 1..128 characters");
  if (!p.empty()) return absl::InvalidArgumentError(absl::StrJoin(p, "\n"));
  return absl::OkStatus();
}

namespace {

// Three significant digits (absl::StrFormat is not among this library's dependencies).
std::string Sig3(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", x);
  return buf;
}
std::string GiB(double bytes) { return Sig3(bytes / double(int64_t{1} << 30)) + " GiB"; }

}  // namespace

std::string MemoryEstimate::ToString(int stages) const {
  return absl::StrCat("stage ", stage, " of ", stages, ": ", Sig3(parameters),
                      " parameters; weights ", GiB(weight_bytes), " + gradients ", GiB(gradient_bytes),
                      " + optimizer state ", GiB(optimizer_bytes), " + activations ", GiB(activation_bytes), " = ",
                      GiB(total_bytes()));
}

MemoryEstimate EstimateStageMemory(const v1::JobSpec& spec) {
  // Doubles throughout: the sizes a spec may name overflow int64 products (65536^2 x 1024 x 16).
  const v1::ModelSpec& m = spec.model();
  const double h = m.hidden(), s = m.context(), v = m.vocab();
  const int S = std::max(1, spec.stages());
  const double b = std::max(1, spec.micro_batch_size());
  const double per_layer = 12 * h * h + 13 * h;  // attention 4h^2+4h, MLP 8h^2+5h, two LayerNorms 4h
  // A lower bound of what a layer keeps for its backward pass: 16 values of s x b x h (Korthikanti's
  // 34 s·b·h bytes at 16 bits, less the two 1-byte dropout masks this model does not have); no
  // s^2 attention scores (fused attention does not keep them).
  const double element = spec.precision() == "bf16" ? 2 : 4;
  const double act_per_layer = 16 * s * b * h * element;
  absl::StatusOr<std::vector<stage_runtime::LayerRange>> parts = stage_runtime::PartitionLayers(m.layers(), S);
  MemoryEstimate worst;
  for (int i = 0; i < S; ++i) {
    const double layers = parts.ok() ? (*parts)[i].end - (*parts)[i].begin : double(m.layers()) / S;
    const int M = ReplicaMicroBatches(spec, i);  // this stage's replicas' share of the step
    const double optimizer_share = ShardsOptimizerState(spec, i) ? 1.0 / StageReplicas(spec, i) : 1.0;
    MemoryEstimate e;
    e.stage = i;
    e.parameters = layers * per_layer;
    if (i == 0) e.parameters += (v + s) * h;   // wte, wpe
    if (i == S - 1) e.parameters += 2 * h + v * h;  // ln_f, lm_head (untied, no bias)
    e.weight_bytes = 4 * e.parameters;
    e.gradient_bytes = 4 * e.parameters;
    e.optimizer_bytes = 8 * e.parameters * optimizer_share;
    const double in_flight = spec.schedule() == "gpipe" ? M : std::min(M, S - i);
    e.activation_bytes = in_flight * layers * act_per_layer;
    if (i == S - 1) e.activation_bytes += 2 * b * s * v * element;  // one micro-batch's logits and their gradient
    if (e.total_bytes() > worst.total_bytes()) worst = e;
  }
  return worst;
}

}  // namespace longhaul::coordinator
