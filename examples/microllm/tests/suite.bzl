"""The microllm GPU test suite: one entry per gpu_test target (single source of truth).

BUILD.bazel loads SUITE and declares one gpu_test per entry; tests/harness.py parses this same
dict literal (ast.literal_eval) for pytest and for each test's defaults, so the two never drift.
Keep it a plain literal: no function calls, no variables, no concatenation.

Per entry:
  gpus         GPUs (ranks) the test uses: tp * pp * dp of its largest layout.
  workload     dimension -> full value; reaches the test as --<dim>=<value>.
  floors       dimension -> lowest value a plan may shrink it to. A dimension without a floor
               is frozen: it is what the test validates (its scope) or an absolute check was
               calibrated at it.
  scope        what the test validates.
  constraints  Python/Starlark expressions over dimension names that every workload satisfies.
  tags         check:<exact|tolerance|threshold|completes> is the strength of the check;
               reference:<relational|absolute> says whether it compares two runs made in the
               test (meaningful at any workload) or fixed numbers calibrated at the full
               workload (goldens, thresholds).
"""

SUITE = {
    "tp_parity_test": {
        "gpus": 2,
        "workload": {"tp": 2, "train_iters": 8, "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_length": 128, "vocab_size": 500, "micro_batch_size": 2, "global_batch_size": 8},
        "floors": {"train_iters": 2, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "seq_length": 16, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 1},
        "scope": ["parallel_parity"],
        "constraints": ["num_heads % tp == 0", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % micro_batch_size == 0"],
        "tags": ["check:tolerance", "reference:relational"],
    },
    "sp_parity_test": {
        "gpus": 2,
        "workload": {"tp": 2, "train_iters": 8, "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_length": 128, "vocab_size": 500, "micro_batch_size": 2, "global_batch_size": 8},
        "floors": {"train_iters": 2, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "seq_length": 16, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 1},
        "scope": ["parallel_parity"],
        "constraints": ["num_heads % tp == 0", "seq_length % tp == 0", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % micro_batch_size == 0"],
        "tags": ["check:tolerance", "reference:relational"],
    },
    "pp_parity_test": {
        "gpus": 2,
        "workload": {"pp": 2, "train_iters": 16, "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_length": 128, "vocab_size": 500, "micro_batch_size": 2, "global_batch_size": 8},
        "floors": {"train_iters": 2, "num_layers": 2, "hidden_size": 32, "num_heads": 2, "seq_length": 16, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 2},
        "scope": ["parallel_parity"],
        "constraints": ["num_layers % pp == 0", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % micro_batch_size == 0", "global_batch_size // micro_batch_size >= pp"],
        "tags": ["check:tolerance", "reference:relational"],
    },
    "pp_schedule_test": {
        "gpus": 4,
        "workload": {"pp": 4, "train_iters": 6, "num_layers": 8, "hidden_size": 128, "num_heads": 8, "seq_length": 128, "vocab_size": 500, "micro_batch_size": 1, "global_batch_size": 8},
        "floors": {"train_iters": 1, "num_layers": 4, "hidden_size": 32, "num_heads": 2, "seq_length": 16, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 5},
        "scope": ["parallel_parity"],
        "constraints": ["num_layers % pp == 0", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % micro_batch_size == 0", "global_batch_size // micro_batch_size > pp"],
        "tags": ["check:exact", "reference:relational"],
    },
    "dp_parity_test": {
        "gpus": 2,
        "workload": {"dp": 2, "train_iters": 20, "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_length": 128, "vocab_size": 500, "micro_batch_size": 2, "global_batch_size": 8},
        "floors": {"train_iters": 2, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "seq_length": 16, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 2},
        "scope": ["parallel_parity"],
        "constraints": ["hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % (micro_batch_size * dp) == 0"],
        "tags": ["check:tolerance", "reference:relational"],
    },
    "zero1_optimizer_test": {
        "gpus": 2,
        "workload": {"dp": 2, "train_iters": 10, "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_length": 128, "vocab_size": 500, "micro_batch_size": 2, "global_batch_size": 8},
        "floors": {"train_iters": 2, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "seq_length": 16, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 2},
        "scope": ["optimizer_parity"],
        "constraints": ["hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % (micro_batch_size * dp) == 0"],
        "tags": ["check:tolerance", "reference:relational"],
    },
    "parallel_3d_test": {
        "gpus": 8,
        "workload": {"tp": 2, "pp": 2, "dp": 2, "train_iters": 12, "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_length": 128, "vocab_size": 500, "micro_batch_size": 1, "global_batch_size": 8},
        "floors": {"train_iters": 2, "num_layers": 2, "hidden_size": 32, "num_heads": 2, "seq_length": 16, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 4},
        "scope": ["parallel_parity"],
        "constraints": ["num_heads % tp == 0", "num_layers % pp == 0", "seq_length % tp == 0", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % (micro_batch_size * dp) == 0", "global_batch_size // (micro_batch_size * dp) >= pp"],
        "tags": ["check:tolerance", "reference:relational"],
    },
    "gloo_parity_test": {
        "gpus": 2,
        "workload": {"tp": 2, "train_iters": 6, "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_length": 128, "vocab_size": 500, "micro_batch_size": 2, "global_batch_size": 8},
        "floors": {"train_iters": 1, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "seq_length": 16, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 1},
        "scope": ["parallel_parity", "distributed_backend"],
        "constraints": ["num_heads % tp == 0", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % micro_batch_size == 0"],
        "tags": ["check:exact", "reference:relational", "multiprocess"],
    },
    "moe_parity_test": {
        "gpus": 2,
        "workload": {"tp": 2, "num_experts": 4, "moe_top_k": 2, "train_iters": 10, "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_length": 128, "vocab_size": 500, "micro_batch_size": 2, "global_batch_size": 8},
        "floors": {"train_iters": 2, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "seq_length": 16, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 1},
        "scope": ["parallel_parity", "moe"],
        "constraints": ["num_heads % tp == 0", "seq_length % tp == 0", "moe_top_k <= num_experts", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % micro_batch_size == 0"],
        "tags": ["check:tolerance", "reference:relational"],
    },
    "attention_impl_parity_test": {
        "gpus": 1,
        "workload": {"attention_chunk": 32, "train_iters": 6, "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_length": 240, "vocab_size": 500, "micro_batch_size": 2, "global_batch_size": 4},
        "floors": {"train_iters": 1, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "seq_length": 80, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 1},
        "scope": ["kernel_parity"],
        "constraints": ["seq_length > 2 * attention_chunk", "seq_length % attention_chunk != 0", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % micro_batch_size == 0"],
        "tags": ["check:tolerance", "reference:relational"],
    },
    "kv_cache_decode_test": {
        "gpus": 2,
        "workload": {"tp": 2, "decode_tokens": 48, "train_iters": 20, "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_length": 64, "vocab_size": 500, "micro_batch_size": 4, "global_batch_size": 8},
        "floors": {"decode_tokens": 3, "train_iters": 1, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "seq_length": 8, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 1},
        "scope": ["decode_parity"],
        "constraints": ["num_heads % tp == 0", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % micro_batch_size == 0", "decode_tokens >= 2"],
        "tags": ["check:exact", "reference:relational"],
    },
    "recompute_parity_test": {
        "gpus": 2,
        "workload": {"tp": 2, "train_iters": 8, "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_length": 128, "vocab_size": 500, "micro_batch_size": 2, "global_batch_size": 8},
        "floors": {"train_iters": 2, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "seq_length": 16, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 1},
        "scope": ["recompute_parity"],
        "constraints": ["num_heads % tp == 0", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % micro_batch_size == 0"],
        "tags": ["check:exact", "reference:relational"],
    },
    "grad_accumulation_test": {
        "gpus": 1,
        "workload": {"train_iters": 10, "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_length": 128, "vocab_size": 500, "micro_batch_size": 1, "global_batch_size": 8},
        "floors": {"train_iters": 2, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "seq_length": 16, "vocab_size": 50, "global_batch_size": 2},
        "scope": ["grad_accumulation"],
        "constraints": ["hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % micro_batch_size == 0", "global_batch_size // micro_batch_size >= 2"],
        "tags": ["check:tolerance", "reference:relational"],
    },
    "checkpoint_resume_test": {
        "gpus": 4,
        "workload": {"tp": 2, "pp": 2, "train_iters": 16, "save_interval": 8, "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_length": 128, "vocab_size": 500, "micro_batch_size": 2, "global_batch_size": 8},
        "floors": {"train_iters": 2, "save_interval": 1, "num_layers": 2, "hidden_size": 32, "num_heads": 2, "seq_length": 16, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 2},
        "scope": ["checkpoint_resume"],
        "constraints": ["train_iters >= 2 * save_interval", "num_heads % tp == 0", "num_layers % pp == 0", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % micro_batch_size == 0", "global_batch_size // micro_batch_size >= pp"],
        "tags": ["check:exact", "reference:relational"],
    },
    "checkpoint_reshard_test": {
        "gpus": 4,
        "workload": {"tp": 2, "pp": 2, "load_tp": 4, "load_pp": 1, "train_iters": 12, "save_interval": 6, "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_length": 128, "vocab_size": 500, "micro_batch_size": 2, "global_batch_size": 8},
        "floors": {"train_iters": 2, "save_interval": 1, "num_layers": 2, "hidden_size": 32, "num_heads": 4, "seq_length": 16, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 2},
        "scope": ["checkpoint_reshard"],
        "constraints": ["train_iters >= 2 * save_interval", "num_heads % tp == 0", "num_heads % load_tp == 0", "num_layers % pp == 0", "num_layers % load_pp == 0", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % micro_batch_size == 0", "global_batch_size // micro_batch_size >= max(pp, load_pp)"],
        "tags": ["check:tolerance", "reference:relational"],
    },
    "data_resume_test": {
        "gpus": 2,
        "workload": {"dp": 2, "train_iters": 24, "save_interval": 8, "num_samples": 76, "num_layers": 2, "hidden_size": 128, "num_heads": 8, "seq_length": 128, "vocab_size": 500, "micro_batch_size": 2, "global_batch_size": 8},
        "floors": {"train_iters": 2, "save_interval": 1, "num_samples": 6, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "seq_length": 8, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 4},
        "scope": ["data_resume"],
        "constraints": ["train_iters >= 2 * save_interval", "train_iters * global_batch_size > num_samples", "num_samples % global_batch_size != 0", "global_batch_size % (micro_batch_size * dp) == 0", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0"],
        "tags": ["check:exact", "reference:relational"],
    },
    "determinism_test": {
        "gpus": 4,
        "workload": {"tp": 2, "dp": 2, "train_iters": 8, "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_length": 128, "vocab_size": 500, "micro_batch_size": 1, "global_batch_size": 8},
        "floors": {"train_iters": 2, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "seq_length": 16, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 2},
        "scope": ["determinism"],
        "constraints": ["num_heads % tp == 0", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % (micro_batch_size * dp) == 0"],
        "tags": ["check:exact", "reference:relational"],
    },
    "eval_loop_test": {
        "gpus": 2,
        "workload": {"pp": 2, "train_iters": 20, "eval_interval": 5, "eval_iters": 4, "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_length": 128, "vocab_size": 500, "micro_batch_size": 2, "global_batch_size": 8},
        "floors": {"train_iters": 2, "eval_interval": 1, "eval_iters": 1, "num_layers": 2, "hidden_size": 32, "num_heads": 2, "seq_length": 16, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 2},
        "scope": ["eval"],
        "constraints": ["train_iters >= 2 * eval_interval", "num_layers % pp == 0", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % micro_batch_size == 0", "global_batch_size // micro_batch_size >= pp"],
        "tags": ["check:exact", "reference:relational"],
    },
    "lr_schedule_test": {
        "gpus": 1,
        "workload": {"train_iters": 30, "lr_decay_iters": 40, "warmup_iters": 5, "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_length": 128, "vocab_size": 500, "micro_batch_size": 2, "global_batch_size": 4},
        "floors": {"train_iters": 14, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "seq_length": 8, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 1},
        "scope": ["lr_schedule"],
        "constraints": ["train_iters // 2 >= warmup_iters + 2", "lr_decay_iters > train_iters", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % micro_batch_size == 0"],
        "tags": ["check:exact", "reference:relational"],
    },
    "bf16_closeness_test": {
        "gpus": 1,
        "workload": {"dtype": "bf16", "train_iters": 16, "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_length": 128, "vocab_size": 500, "micro_batch_size": 2, "global_batch_size": 8},
        "floors": {"train_iters": 2, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "seq_length": 16, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 1},
        "scope": ["numerics"],
        "constraints": ["hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % micro_batch_size == 0"],
        "tags": ["check:tolerance", "reference:relational"],
    },
    "fp16_loss_scaler_test": {
        "gpus": 1,
        "workload": {"dtype": "fp16", "initial_loss_scale": 16777216.0, "loss_scale_window": 4, "train_iters": 40, "num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_length": 64, "vocab_size": 256, "micro_batch_size": 2, "global_batch_size": 8},
        "floors": {"initial_loss_scale": 1048576.0, "loss_scale_window": 2, "train_iters": 10, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "seq_length": 16, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 2},
        "scope": ["numerics", "loss_scaling"],
        "constraints": ["loss_scale_window >= 2", "train_iters >= 3 * loss_scale_window + 4", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % micro_batch_size == 0"],
        "tags": ["check:exact", "reference:relational"],
    },
    "zero1_uneven_shard_test": {
        "gpus": 3,
        "workload": {"dp": 3, "train_iters": 10, "num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_length": 64, "vocab_size": 256, "micro_batch_size": 2, "global_batch_size": 12},
        "floors": {"train_iters": 2, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "seq_length": 16, "vocab_size": 56, "micro_batch_size": 1, "global_batch_size": 3},
        "scope": ["optimizer_parity"],
        "constraints": ["vocab_size % 8 == 0", "(2 * vocab_size * hidden_size + hidden_size + num_layers * (2 * hidden_size + 12 * hidden_size * hidden_size)) % dp != 0", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % (micro_batch_size * dp) == 0"],
        "tags": ["check:tolerance", "reference:relational"],
    },
    "bf16_cross_entropy_test": {
        "gpus": 2,
        "workload": {"tp": 2, "logit_scale": 8.0, "vocab_size": 8001, "seq_length": 128, "micro_batch_size": 4},
        "floors": {"vocab_size": 50, "seq_length": 16, "micro_batch_size": 1},
        "scope": ["numerics", "kernel_parity"],
        "constraints": ["vocab_size % (8 * tp) != 0"],
        "tags": ["check:tolerance", "reference:relational"],
    },
    "checkpoint_crash_test": {
        "gpus": 4,
        "workload": {"tp": 2, "pp": 2, "train_iters": 12, "save_interval": 4, "num_layers": 4, "hidden_size": 64, "num_heads": 4, "seq_length": 64, "vocab_size": 256, "micro_batch_size": 2, "global_batch_size": 8},
        "floors": {"train_iters": 2, "save_interval": 1, "num_layers": 2, "hidden_size": 32, "num_heads": 2, "seq_length": 16, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 2},
        "scope": ["checkpoint_resume", "checkpoint_integrity"],
        "constraints": ["train_iters >= 2 * save_interval", "num_heads % tp == 0", "num_layers % pp == 0", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % micro_batch_size == 0", "global_batch_size // micro_batch_size >= pp"],
        "tags": ["check:exact", "reference:relational"],
    },
    "convergence_test": {
        "gpus": 1,
        "workload": {"train_iters": 80, "loss_threshold": 1.6, "num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_length": 64, "vocab_size": 128, "micro_batch_size": 4, "global_batch_size": 16},
        "floors": {},
        "scope": ["convergence"],
        "constraints": ["hidden_size % num_heads == 0", "global_batch_size % micro_batch_size == 0"],
        "tags": ["check:threshold", "reference:absolute"],
    },
    "golden_loss_test": {
        "gpus": 2,
        "workload": {"tp": 2, "train_iters": 40, "lr_decay_iters": 40, "num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_length": 64, "vocab_size": 128, "micro_batch_size": 4, "global_batch_size": 16},
        "floors": {"train_iters": 3},
        "scope": ["golden_regression"],
        "constraints": ["train_iters <= lr_decay_iters", "num_heads % tp == 0"],
        "tags": ["check:tolerance", "reference:absolute", "golden"],
    },
    "throughput_test": {
        "gpus": 1,
        "workload": {"train_iters": 12, "min_tokens_per_s": 2000.0, "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_length": 128, "vocab_size": 500, "micro_batch_size": 4, "global_batch_size": 16},
        "floors": {},
        "scope": ["throughput"],
        "constraints": ["global_batch_size % micro_batch_size == 0"],
        "tags": ["check:threshold", "reference:absolute", "perf", "exclusive"],
    },
    "config_validation_test": {
        "gpus": 0,
        "workload": {"tp": 2, "pp": 2, "dp": 2, "num_layers": 4, "num_heads": 8, "hidden_size": 128, "micro_batch_size": 1, "global_batch_size": 8},
        "floors": {"num_layers": 2, "num_heads": 2, "hidden_size": 32, "global_batch_size": 4},
        "scope": ["config_validation"],
        "constraints": ["num_heads % tp == 0", "num_layers % pp == 0", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % (micro_batch_size * dp) == 0", "global_batch_size // (micro_batch_size * dp) >= pp"],
        "tags": ["check:exact", "reference:relational"],
    },
    "train_cli_smoke_test": {
        "gpus": 2,
        "workload": {"tp": 2, "train_iters": 8, "save_interval": 4, "eval_interval": 4, "num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_length": 64, "vocab_size": 256, "micro_batch_size": 2, "global_batch_size": 8},
        "floors": {"train_iters": 2, "save_interval": 1, "eval_interval": 1, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "seq_length": 8, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 1},
        "scope": ["smoke"],
        "constraints": ["train_iters >= 2 * save_interval", "num_heads % tp == 0", "hidden_size % num_heads == 0", "(hidden_size // num_heads) % 2 == 0", "global_batch_size % micro_batch_size == 0"],
        "tags": ["check:completes", "reference:relational"],
    },
}
