//! Moving a running vGPU between physical GPUs: pre-copy, drain, switch, rollback.
