#include "tools/ckptctl/commands.h"

namespace ckpt::ckptctl {

const std::vector<Command>& AllCommands() {
  static const std::vector<Command>* commands = new std::vector<Command>{
      {"plan", "Megatron-exact distributions, DTensor shards on JSON Lines (see plan --help)",
       RunPlanCommand, PlanSpec},
      {"inspect", "show a checkpoint's tensors, pieces, files, layout and metadata",
       RunInspectCommand, InspectSpec},
      {"verify", "check manifest/file agreement, every checksum and exact coverage",
       RunVerifyCommand, VerifySpec},
      {"import", "convert Hugging Face safetensors or PyTorch DCP into a checkpoint",
       RunImportCommand, ImportSpec},
      {"export", "consolidate a checkpoint into safetensors, or write PyTorch DCP",
       RunExportCommand, ExportSpec},
      {"diff", "compare two checkpoints (any formats, layouts) tensor by tensor; exit 0 same",
       RunDiffCommand, DiffSpec},
      {"status", "workers, jobs and operations in flight (with progress) of a coordinator",
       RunStatusCommand, StatusSpec},
      {"save", "operator-requested save of a running job (at its next Poll); waits for commit",
       RunSaveCommand, SaveSpec},
      {"load", "operator-requested load of a running job into its current layout", RunLoadCommand,
       LoadSpec},
      {"reshard", "rewrite a checkpoint into a target layout's pieces (in-process or on a cluster)",
       RunReshardCommand, ReshardSpec},
      {"certs", "make the CA and the coordinator/worker/operator certificates (TLS)",
       RunCertsCommand, CertsSpec},
      {"gc", "remove the staging directories interrupted writes left (listed with sizes)",
       RunGcCommand, GcSpec},
      {"copy", "copy a checkpoint between stores (directories, s3://), verifying every byte",
       RunCopyCommand, CopySpec},
      {"transfer", "live transfer: published names and versions, publishes and receives",
       RunTransferCommand, TransferSpec},
  };
  return *commands;
}

}  // namespace ckpt::ckptctl
