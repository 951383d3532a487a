//! Tests of launch-environment parsing for torchrun and Slurm variables.

use std::collections::HashMap;
use std::time::Duration;

use super::*;

fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

const TORCHRUN: [(&str, &str); 8] = [
    ("RANK", "3"),
    ("WORLD_SIZE", "4"),
    ("LOCAL_RANK", "1"),
    ("LOCAL_WORLD_SIZE", "2"),
    ("MASTER_ADDR", "10.1.2.3"),
    ("MASTER_PORT", "29500"),
    ("WEFT_JOB_ID", "job7"),
    ("WEFT_JOB_TOKEN", "tok"),
];

#[test]
fn torchrun_variables_are_read() {
    let env = LaunchEnv::from_lookup(lookup(&TORCHRUN)).unwrap();
    assert_eq!(
        env,
        LaunchEnv {
            rank: 3,
            world_size: 4,
            local_rank: 1,
            local_world_size: 2,
            master_addr: "10.1.2.3".into(),
            store_port: 29500,
            job_id: "job7".into(),
            job_token: "tok".into(),
            timeout: DEFAULT_TIMEOUT,
            store_bind_addr: "127.0.0.1".into(),
        }
    );
    let mut with_timeout = TORCHRUN.to_vec();
    with_timeout.push(("WEFT_TIMEOUT", "1.5"));
    let env = LaunchEnv::from_lookup(lookup(&with_timeout)).unwrap();
    assert_eq!(env.timeout, Duration::from_millis(1500));
}

#[test]
fn missing_or_invalid_variables_are_named() {
    for (var, value) in [
        ("RANK", None),
        ("WORLD_SIZE", Some("four")),
        ("RANK", Some("4")),
        ("LOCAL_RANK", Some("2")),
        ("MASTER_PORT", Some("70000")),
        ("MASTER_ADDR", None),
        ("WEFT_JOB_TOKEN", None),
        ("WEFT_TIMEOUT", Some("-3")),
    ] {
        let mut vars: Vec<(&str, &str)> = TORCHRUN
            .iter()
            .copied()
            .filter(|(k, _)| *k != var)
            .collect();
        if let Some(value) = value {
            vars.push((var, value));
        }
        let err = LaunchEnv::from_lookup(lookup(&vars)).unwrap_err();
        assert!(
            matches!(&err, CommError::Env { var: named, .. } if *named == var),
            "{var}: {err}"
        );
    }
}

#[test]
fn slurm_variables_are_read_with_derived_master() {
    let vars = [
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NNODES", "2"),
        ("SLURM_NTASKS_PER_NODE", "4"),
        ("SLURM_JOB_NODELIST", "gpu[07-08]"),
        ("SLURM_JOB_ID", "123456"),
        ("WEFT_JOB_TOKEN", "tok"),
    ];
    let env = LaunchEnv::from_lookup(lookup(&vars)).unwrap();
    assert_eq!(
        (
            env.rank,
            env.world_size,
            env.local_rank,
            env.local_world_size
        ),
        (5, 8, 1, 4)
    );
    assert_eq!(env.master_addr, "gpu07");
    assert_eq!(env.store_port, 20000 + (123456 % 20000) as u16);
    assert_eq!(env.job_id, "123456");
}

#[test]
fn first_hosts_of_node_lists() {
    assert_eq!(first_host("node01").as_deref(), Some("node01"));
    assert_eq!(first_host("a,b").as_deref(), Some("a"));
    assert_eq!(first_host("node[03-05,9],gpu1").as_deref(), Some("node03"));
    assert_eq!(first_host("x-[1]").as_deref(), Some("x-1"));
    assert_eq!(first_host("gpu1,node[2-3]").as_deref(), Some("gpu1"));
    assert_eq!(first_host("rack[1-2]-node[1-4]"), None);
    assert_eq!(first_host("node[a-b]"), None);
    assert_eq!(first_host(""), None);
}

/// What torchrun sets in each worker (no weft variable): the token comes from its run id and
/// rendezvous address, and the store moves off MASTER_PORT, which torchrun's agent holds.
#[test]
fn a_torchrun_job_needs_no_weft_variable() {
    let torchrun = [
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("TORCHELASTIC_RUN_ID", "5f2c"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
    ];
    let env = LaunchEnv::from_lookup(lookup(&torchrun)).unwrap();
    assert_eq!(env.store_port, 29501);
    assert_eq!(env.job_token, "torchrun:5f2c@127.0.0.1:29500");
    let mut overridden = torchrun.to_vec();
    overridden.extend([("WEFT_JOB_TOKEN", "mine"), ("WEFT_STORE_PORT", "31000")]);
    let env = LaunchEnv::from_lookup(lookup(&overridden)).unwrap();
    assert_eq!((env.job_token.as_str(), env.store_port), ("mine", 31000));
    let mut top = torchrun.to_vec();
    top[5] = ("MASTER_PORT", "65535");
    let err = LaunchEnv::from_lookup(lookup(&top))
        .unwrap_err()
        .to_string();
    assert!(err.contains("WEFT_STORE_PORT"), "{err}");
}

/// What `srun` sets in an sbatch script's tasks (no weft variable): the token comes from the
/// job and step ids, the same in every task of the step.
#[test]
fn a_slurm_job_needs_no_weft_variable() {
    let task = |rank: &'static str| {
        [
            ("SLURM_PROCID", rank),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", rank),
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_STEP_ID", "0"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29600"),
        ]
    };
    let (first, second) = (
        LaunchEnv::from_lookup(lookup(&task("0"))).unwrap(),
        LaunchEnv::from_lookup(lookup(&task("1"))).unwrap(),
    );
    assert_eq!(first.job_token, "slurm:4242.0");
    assert_eq!(first.job_token, second.job_token);
    assert_eq!((first.store_port, second.rank), (29600, 1));
}

#[test]
fn without_a_token_or_a_launcher_identity_the_error_names_the_variable() {
    let mut bare = TORCHRUN.to_vec();
    bare.retain(|(k, _)| *k != "WEFT_JOB_TOKEN");
    let err = LaunchEnv::from_lookup(lookup(&bare))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("WEFT_JOB_TOKEN") && err.contains("weft-run"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1);
}

#[test]
fn the_nccl_stream_priority_is_read_and_a_bad_value_named() {
    let read = |value: Option<&str>| {
        let pairs: Vec<(&str, &str)> = value
            .map(|v| vec![(NCCL_HIGH_PRIORITY_VAR, v)])
            .unwrap_or_default();
        nccl_high_priority(lookup(&pairs))
    };
    assert!(!read(None).unwrap());
    assert!(!read(Some("0")).unwrap());
    assert!(read(Some("1")).unwrap());
    assert!(read(Some(" true")).unwrap());
    let err = read(Some("yes")).unwrap_err();
    assert!(
        matches!(&err, CommError::Env { var, .. } if *var == NCCL_HIGH_PRIORITY_VAR),
        "{err}"
    );
}

#[test]
fn nccl_graph_mixing_is_on_unless_zero_and_a_bad_value_named() {
    let read = |value: Option<&str>| {
        let pairs: Vec<(&str, &str)> = value
            .map(|v| vec![(NCCL_GRAPH_MIXING_VAR, v)])
            .unwrap_or_default();
        nccl_graph_mixing(lookup(&pairs))
    };
    assert!(read(None).unwrap());
    assert!(read(Some("1")).unwrap());
    assert!(!read(Some("0")).unwrap());
    assert!(!read(Some(" 0 ")).unwrap());
    let err = read(Some("off")).unwrap_err();
    assert!(
        matches!(&err, CommError::Env { var, .. } if *var == NCCL_GRAPH_MIXING_VAR),
        "{err}"
    );
}

#[test]
fn the_backend_is_read_and_a_bad_value_named() {
    let read = |value: Option<&str>| {
        let pairs: Vec<(&str, &str)> = value.map(|v| vec![(BACKEND_VAR, v)]).unwrap_or_default();
        requested_backend(lookup(&pairs))
    };
    assert_eq!(read(None).unwrap(), None);
    assert_eq!(read(Some("")).unwrap(), None);
    assert_eq!(read(Some("nccl")).unwrap(), Some(Backend::Nccl));
    assert_eq!(read(Some(" shm ")).unwrap(), Some(Backend::Shm));
    let err = read(Some("gloo")).unwrap_err();
    assert!(
        matches!(&err, CommError::Env { var, .. } if *var == BACKEND_VAR),
        "{err}"
    );
    assert!(err.to_string().contains("gloo"), "{err}");
}
