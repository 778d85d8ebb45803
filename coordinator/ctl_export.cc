#include "coordinator/ctl_export.h"

#include <cstdio>

#include <grpcpp/grpcpp.h>

#include "coordinator/ctl_channel.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "coordinator/hf_export.h"
#include "coordinator/states.h"
#include "longhaul/v1/control_plane.grpc.pb.h"
#include "proto/channel_config.h"

namespace longhaul::coordinator {
namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "longhaulctl: export: %s\n", msg.c_str());
  return 1;
}

// Where stage `s`'s checkpoint is read from, or why it is not known.
absl::StatusOr<std::string> StagePath(const v1::JobStatus& j, int s, const std::string& checkpoint_dir) {
  // The layout the workers write (stage_runtime::StageCheckpointPath).
  const std::string file = absl::StrCat("stage-", s, ".safetensors");
  if (!checkpoint_dir.empty()) return absl::StrCat(checkpoint_dir, "/", file);
  const v1::StagePlacement& p = j.stages(s);
  if (!p.checkpoint_path().empty()) return p.checkpoint_path();
  if (!j.spec().checkpoint_dir().empty()) return absl::StrCat(j.spec().checkpoint_dir(), "/", file);
  return absl::NotFoundError(absl::StrCat(
      "the job record has no checkpoint path for stage ", s, " (worker ", p.worker_name(),
      IsTerminal(j.state()) ? " did not report one" : " reports it when the job ends",
      "); its files are in <that worker's --data-dir>/jobs/", j.job_id(),
      ": pass --checkpoint-dir (copy every stage's file there if the stages ran on several machines)"));
}

std::string HumanBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  for (; b >= 1024 && u < 4; ++u) b /= 1024;
  return absl::StrFormat("%.1f %s", b, units[u]);
}

}  // namespace

CLI::App* AddExportCommand(CLI::App& app, ExportFlags* f) {
  CLI::App* cmd = app.add_subcommand(
      "export",
      "a job's stage checkpoints as one Hugging Face GPT-2 directory (config.json + model.safetensors)\n"
      "that transformers.GPT2LMHeadModel.from_pretrained(DIR) loads");
  cmd->add_option("job", f->job, "the job id")->type_name("JOB")->required();
  cmd->add_option("--format", f->format, "output format (hf: Hugging Face transformers, GPT-2)")
      ->type_name("FORMAT")
      ->check(CLI::IsMember({"hf"}));
  cmd->add_option("--out", f->out, "output directory (created; its config.json and model.safetensors are replaced)")
      ->type_name("DIR")
      ->required();
  cmd->add_option("--checkpoint-dir", f->checkpoint_dir,
                  "read DIR/stage-<s>.safetensors for every stage instead of the paths in the job record")
      ->type_name("DIR");
  cmd->footer(
      "Where the checkpoints are read: without --checkpoint-dir, where each worker reported its stage's\n"
      "file when the job ended (`longhaulctl status JOB` lists them), or, for a job still running, under\n"
      "its spec's checkpoint.dir. They must be readable on this machine: when the stages ran on several\n"
      "machines, copy their stage-<s>.safetensors files (by default <worker --data-dir>/jobs/<JOB>/) into\n"
      "one directory and pass it as --checkpoint-dir. A running job is exported from its last checkpoint\n"
      "(checkpoint.interval in the spec); every stage's file must be from the same step.\n"
      "The model's shape (layers, hidden, heads, context, vocab) comes from the job record. With\n"
      "data.format text the token ids are UTF-8 bytes (no tokenizer needed); config.json records the job\n"
      "under \"longhaul\".");
  return cmd;
}

int RunExport(const std::string& coordinator, const ExportFlags& f) {
  auto stub = v1::Coordinator::NewStub(CoordinatorChannel(coordinator));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::GetJobRequest req;
  req.set_job_id(f.job);
  v1::JobStatus j;
  grpc::Status rpc = stub->GetJob(&ctx, req, &j);
  if (rpc.error_code() == grpc::StatusCode::UNAVAILABLE || rpc.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return Fail(absl::StrCat("coordinator at ", coordinator, " is not reachable (", rpc.error_message(),
                             "); it holds the job's model shape and checkpoint paths"));
  }
  if (!rpc.ok()) return Fail(rpc.error_message());
  if (j.state() == v1::JOB_STATE_PENDING || j.stages_size() == 0) {
    return Fail(absl::StrCat("job ", f.job, " is ", JobStateName(j.state()), " and has never run: no checkpoints"));
  }
  const v1::JobSpec& spec = j.spec();
  if (j.stages_size() != spec.stages()) {
    return Fail(absl::StrCat("the job record lists ", j.stages_size(), " stage placements for ", spec.stages(),
                             " stages"));
  }
  HfExport e;
  e.model = {spec.model().layers(), spec.model().hidden(), spec.model().heads(), spec.model().context(),
             spec.model().vocab()};
  e.out_dir = f.out;
  e.job_id = j.job_id();
  e.job_name = j.name();
  e.data_format = spec.data_format().empty() ? "text" : spec.data_format();
  for (int s = 0; s < j.stages_size(); ++s) {
    absl::StatusOr<std::string> path = StagePath(j, s, f.checkpoint_dir);
    if (!path.ok()) return Fail(std::string(path.status().message()));
    e.stages.push_back({s, *path, j.stages(s).layer_begin(), j.stages(s).layer_end()});
  }
  absl::StatusOr<HfExportResult> r = ExportHuggingFaceGpt2(e);
  if (!r.ok()) {
    std::string hint;
    if (absl::IsNotFound(r.status())) {
      hint = j.state() == v1::JOB_STATE_RUNNING
                 ? (spec.checkpoint_interval() > 0
                        ? absl::StrCat(" (job ", f.job, " is running and writes a checkpoint every ",
                                       spec.checkpoint_interval(), " steps: none yet?)")
                        : absl::StrCat(" (job ", f.job, " is running and writes its checkpoints after its last step)"))
                 : f.checkpoint_dir.empty() ? " (on another machine? copy every stage's file into one directory "
                                              "and pass --checkpoint-dir)"
                                            : "";
    }
    return Fail(absl::StrCat(r.status().message(), hint));
  }
  if (j.state() != v1::JOB_STATE_SUCCEEDED) {
    std::printf("note: job %llu is %s; exported its last checkpoint\n", static_cast<unsigned long long>(f.job),
                JobStateName(j.state()));
  }
  std::printf("exported job %llu (%s) at step %lld: %lld parameters, %s\n", static_cast<unsigned long long>(f.job),
              j.name().c_str(), static_cast<long long>(r->step), static_cast<long long>(r->parameters),
              HumanBytes(static_cast<double>(r->bytes)).c_str());
  std::printf("  %s/config.json\n  %s/model.safetensors\n", f.out.c_str(), f.out.c_str());
  std::printf("load it with: transformers.GPT2LMHeadModel.from_pretrained(\"%s\")\n", f.out.c_str());
  return 0;
}

}  // namespace longhaul::coordinator
