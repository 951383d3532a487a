//! Valid inputs each fuzz target starts from, so the fuzzer explores past the format's first
//! checks (a CIFAR record is 3073 bytes; a safetensors header must be JSON of the right size).

use std::collections::HashMap;

use anyhow::Result;
use candle_core::{DType, Device, Tensor};

/// A store frame: a big-endian `u32` length, then the message.
fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = (message.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(message);
    out
}

/// A store message: a tag, then fields (byte strings with a `u32` length, integers of 8 bytes).
fn message(tag: u8, fields: &[Field]) -> Vec<u8> {
    let mut out = vec![tag];
    for field in fields {
        match field {
            Field::Bytes(b) => {
                out.extend_from_slice(&(b.len() as u32).to_be_bytes());
                out.extend_from_slice(b);
            }
            Field::Int(i) => out.extend_from_slice(&i.to_be_bytes()),
        }
    }
    out
}

enum Field<'a> {
    Bytes(&'a [u8]),
    Int(u64),
}

/// The requests a client sends after its hello (the store fuzz targets' token).
fn store_session() -> Vec<u8> {
    use Field::{Bytes, Int};
    [
        message(1, &[Bytes(b"fuzz-token")]),
        message(2, &[Bytes(b"key"), Bytes(b"value")]),
        message(3, &[Bytes(b"key"), Int(10)]),
        message(4, &[Int(2), Bytes(b"key"), Bytes(b"other"), Int(10)]),
        message(5, &[Bytes(b"counter"), Int(3)]),
    ]
    .iter()
    .flat_map(|m| frame(m))
    .collect()
}

/// The store's responses, framed.
fn store_responses() -> Vec<u8> {
    use Field::{Bytes, Int};
    [
        message(0x80, &[]),
        message(0x81, &[Bytes(b"value")]),
        message(0x82, &[Int(7)]),
        message(0x83, &[Int(1), Bytes(b"missing")]),
        message(0x84, &[Bytes(b"an error")]),
    ]
    .iter()
    .flat_map(|m| frame(m))
    .collect()
}

fn cifar_record(label: u8) -> Vec<u8> {
    let mut record = vec![label];
    record.extend((0..3072).map(|i| (i % 251) as u8));
    record
}

fn safetensors(tensors: &[(&str, Tensor)]) -> Result<Vec<u8>> {
    let map: HashMap<String, Tensor> = tensors
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("seed.safetensors");
    candle_core::safetensors::save(&map, &path)?;
    Ok(std::fs::read(path)?)
}

fn manifest(shards: &[(usize, usize)]) -> Vec<u8> {
    let shards: Vec<_> = shards
        .iter()
        .enumerate()
        .map(|(i, (start, end))| {
            serde_json::json!({"file": format!("shard-{i}.safetensors"), "start": start, "end": end})
        })
        .collect();
    serde_json::json!({
        "format": "weft-sharded-v1", "optimizer": "adamw", "step": 3,
        "buffers": ["exp_avg", "exp_avg_sq"], "master_weights": true, "flat_len": 6,
        "entries": [{"name": "w", "shape": [2, 3], "offset": 0}],
        "shards": shards, "model_file": "model.safetensors", "parameters_in_shards": true,
    })
    .to_string()
    .into_bytes()
}

/// The seed inputs of fuzz target `target`.
pub fn seeds(target: &str) -> Result<Vec<Vec<u8>>> {
    let cpu = Device::Cpu;
    Ok(match target {
        "cifar_records" => vec![cifar_record(3), [cifar_record(0), cifar_record(9)].concat()],
        "safetensors_load" => vec![
            safetensors(&[
                ("layer.weight", Tensor::zeros((2, 3), DType::F32, &cpu)?),
                ("layer.bias", Tensor::zeros(3, DType::F32, &cpu)?),
                ("norm.running_mean", Tensor::zeros(3, DType::F32, &cpu)?),
            ])?,
            safetensors(&[("layer.weight", Tensor::zeros(6, DType::F16, &cpu)?)])?,
        ],
        "checkpoint_manifest" => vec![manifest(&[(0, 6)]), manifest(&[(0, 4), (4, 6)])],
        "store_protocol" => vec![store_session(), store_responses()],
        "store_server" => vec![store_session()],
        "run_records" => vec![
            br#"{"step": 4, "epoch_totals": [[1.5, 2.0]]}"#.to_vec(),
            br#"{"format": "weft-tensor-parallel-v1", "size": 2, "splits": [["w", {"columns": {"groups": 1}}]]}"#.to_vec(),
        ],
        "launch_env" => vec![
            b"RANK=1\nWORLD_SIZE=2\nLOCAL_RANK=1\nMASTER_ADDR=127.0.0.1\nMASTER_PORT=29500\nTORCHELASTIC_RUN_ID=r\n".to_vec(),
            b"SLURM_PROCID=3\nSLURM_NTASKS=4\nSLURM_LOCALID=1\nSLURM_NNODES=2\nSLURM_NTASKS_PER_NODE=2\nSLURM_JOB_ID=42\nSLURM_STEP_ID=0\nSLURM_JOB_NODELIST=gpu[01-02]\n".to_vec(),
        ],
        // The kept regression inputs (fuzz/regressions/image_decode) hold whole PNGs.
        "image_decode" => vec![b"\x89PNG\r\n\x1a\n".to_vec()],
        _ => Vec::new(),
    })
}
