//! The launch environment: torchrun's and Slurm's variables as a launcher (or a user) sets
//! them.

use std::collections::HashMap;

use weft_collectives::LaunchEnv;
use weft_train::distributed::{launched, launched_world_size};

/// Bytes read as `NAME=VALUE` lines: reading the launch environment from them is a value or an
/// error naming a variable, never a panic; an accepted one has its rank inside its world, and
/// whether the process counts as a rank agrees with the world size the trainer reads.
pub fn launch_env(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let vars: HashMap<String, String> = text
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lookup = |name: &str| vars.get(name).cloned();
    if let Ok(env) = LaunchEnv::from_lookup(lookup) {
        assert!(env.rank < env.world_size, "{env:?}");
        assert!(env.local_rank < env.local_world_size, "{env:?}");
        assert!(
            env.local_world_size <= env.world_size && env.store_port != 0,
            "{env:?}"
        );
    }
    if let Ok(world) = launched_world_size(lookup) {
        assert!(world >= 1);
        if world > 1 {
            assert!(
                launched(lookup),
                "a world of {world} outside a launched job"
            );
        }
    }
}
