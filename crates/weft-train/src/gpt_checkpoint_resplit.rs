//! A checkpoint resumed by a run split another way than the run that wrote it: another
//! tensor-parallel size (or none), another number of pipeline stages (or none), or both. Every
//! rank reads the checkpoint's whole state by name (model, optimizer buffers, master weights):
//! each stage's tensor-parallel slices joined as [`join_slices`] joins them, then the stages
//! side by side (a name held by an earlier stage — the last stage's copy of the tied token
//! table — is that stage's). It keeps the entries its own part of the model holds, cuts each to
//! its tensor-parallel slice ([`slice_of`]) and loads its range of the flat buffers
//! ([`load_whole_state`]). A name no rank's part holds (another model) or a misshapen entry is
//! refused in one line before anything is written.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use anyhow::{bail, Result};
use weft_parallel::zero::whole_state::{load_whole_state, Named, WholeState};
use weft_parallel::zero::ShardLayout;
use weft_parallel::Trainer;
use weft_tensor::EntryId;

use crate::distributed::RankContext;
use crate::gpt_checkpoint::{join_slices, rank_dir, written_tp_size};
use crate::run_checkpoints::Stage;
use crate::tp_split::{slice_of, Split};

/// A rank's tensor-parallel slices: how its entries are split, its rank in the group and the
/// group's size.
pub struct Slices<'a> {
    pub splits: &'a [(EntryId, Split)],
    pub rank: usize,
    pub size: usize,
}

/// How the resuming rank holds its part of the model.
pub struct Holding<'a> {
    /// Its tensor-parallel slices; none when it holds whole entries.
    pub tensor_parallel: Option<Slices<'a>>,
    /// The cuts of the optimizer state over its replicas, and its own index among them.
    pub shards: (&'a ShardLayout, usize),
}

/// Loads checkpoint `dir`, written with `stages` pipeline stages, into `trainer`, which holds
/// its part of the model as `holding` says; a collective over every rank of the job (`ctx`).
pub fn load_resplit(
    trainer: &mut Trainer,
    (dir, stages): (&Path, usize),
    holding: Holding<'_>,
    ctx: &RankContext,
) -> Result<()> {
    let mut whole = read_whole(dir, stages)?;
    let store = trainer.model().store();
    let ids: HashMap<String, EntryId> = store
        .entries()
        .iter()
        .enumerate()
        .map(|(id, e)| (e.name.clone(), id))
        .collect();
    keep_own_entries(dir, &mut whole, &ids, ctx)?;
    let cut =
        |name: &str, full: &candle_core::Tensor| match (&holding.tensor_parallel, ids.get(name)) {
            (Some(s), Some(&id)) => slice_of(s.splits, id, full, s.rank, s.size),
            _ => Ok(full.clone()),
        };
    load_whole_state(trainer, holding.shards, (dir, &whole), cut)?;
    Ok(())
}

/// The whole state of checkpoint `dir`, written with `stages` pipeline stages.
fn read_whole(dir: &Path, stages: usize) -> Result<WholeState> {
    let parts = (0..stages)
        .map(|index| {
            read_stage(
                &Stage {
                    index,
                    count: stages,
                }
                .part(dir),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    combine(dir, parts, |maps| Ok(side_by_side(maps)))
}

/// The whole state of one stage's part `dir`: its tensor-parallel slices joined, if it has any.
fn read_stage(dir: &Path) -> Result<WholeState> {
    let Some(size) = written_tp_size(dir)? else {
        return Ok(WholeState::read(dir)?);
    };
    let slices = (0..size)
        .map(|rank| Ok(WholeState::read(&rank_dir(dir, rank, size))?))
        .collect::<Result<Vec<_>>>()?;
    combine(dir, slices, |maps| join_slices(dir, maps))
}

/// The parts' states joined map by map with `join`; the parts must agree on the optimizer, its
/// step, its buffers and whether master weights are kept.
fn combine(
    dir: &Path,
    mut parts: Vec<WholeState>,
    join: impl Fn(&[Named]) -> Result<Named>,
) -> Result<WholeState> {
    let Some(first) = parts.first() else {
        bail!("{}: the checkpoint has no parts", dir.display());
    };
    let agrees = |s: &WholeState| {
        (&s.optimizer, s.step, s.master.is_some(), s.buffers.len())
            == (
                &first.optimizer,
                first.step,
                first.master.is_some(),
                first.buffers.len(),
            )
            && s.buffers
                .iter()
                .zip(&first.buffers)
                .all(|(a, b)| a.0 == b.0)
    };
    if let Some(other) = parts.iter().find(|p| !agrees(p)) {
        bail!(
            "{}: the parts disagree: optimizer {} at step {} and {} at step {}",
            dir.display(),
            first.optimizer,
            first.step,
            other.optimizer,
            other.step
        );
    }
    let maps: Vec<Vec<Named>> = parts
        .iter_mut()
        .map(|p| p.maps_mut().map(std::mem::take).collect())
        .collect();
    let mut joined = parts.swap_remove(0);
    for (index, slot) in joined.maps_mut().enumerate() {
        let same: Vec<Named> = maps.iter().map(|m| m[index].clone()).collect();
        *slot = join(&same)?;
    }
    Ok(joined)
}

/// Stages' maps side by side: a name held by several is the first's.
fn side_by_side(maps: &[Named]) -> Named {
    let mut whole = Named::new();
    for map in maps {
        for (name, t) in map {
            whole.entry(name.clone()).or_insert_with(|| t.clone());
        }
    }
    whole
}

/// Leaves in `whole` only the entries this rank's model holds (`ids`), after checking with
/// every rank that each of the checkpoint's entries is held by one of them.
fn keep_own_entries(
    dir: &Path,
    whole: &mut WholeState,
    ids: &HashMap<String, EntryId>,
    ctx: &RankContext,
) -> Result<()> {
    let mut names: Vec<String> = whole.model.keys().cloned().collect();
    names.sort();
    let mut held: Vec<f64> = names
        .iter()
        .map(|n| f64::from(u8::from(ids.contains_key(n))))
        .collect();
    ctx.sum(&mut held)?;
    if let Some((name, _)) = names.iter().zip(&held).find(|(_, &h)| h == 0.0) {
        bail!("{}: holds {name}, which this model has not", dir.display());
    }
    let own: HashSet<&String> = names.iter().filter(|n| ids.contains_key(*n)).collect();
    for map in whole.maps_mut() {
        map.retain(|name, _| own.contains(name));
    }
    Ok(())
}

/// The tensor-parallel size of checkpoint `dir`'s parts (its first stage's), written with
/// `stages` pipeline stages; none when they hold whole entries.
pub fn written_split(dir: &Path, stages: usize) -> Result<Option<usize>> {
    let first = Stage {
        index: 0,
        count: stages,
    }
    .part(dir);
    written_tp_size(&first)
}
