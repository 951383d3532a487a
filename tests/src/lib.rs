//! Workspace-level tests of weft (in `tests/`): whole programs run as several processes, the
//! way users run them, compared with one process. The `weft-train-rank` binary is the ResNet
//! trainer as one rank of a job, `weft-gpt-rank` the GPT trainer; the tests start its ranks with the launch environment
//! (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, ...) themselves.

pub mod rank_job;
