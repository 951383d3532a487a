//! The tensor-parallel pieces on thread ranks against the same computation on one rank, in f64.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var};
use weft_collectives::Communicator;
use weft_tensor::{ParamStore, Scope};
use weft_testing::on_thread_ranks;

use super::*;

fn values(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|i| (((i as u64 * 7919 + seed * 104_729) % 1000) as f64 / 500.0) - 1.0)
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}

fn group(comm: Arc<dyn Communicator>) -> TensorParallelGroup {
    TensorParallelGroup::new(comm)
}

/// f then g around a column layer and a row layer (the MLP's shape) over 2 and 4 ranks equals
/// the unsplit `gelu(x W1 + b1) W2 + b2`: the output, the input's gradient and each rank's
/// slice of the weights' gradients, within 1e-12 (f64; only the summation order differs).
#[test]
fn column_then_row_equals_the_unsplit_layers() {
    let (x0, w1, b1, w2, b2) = (
        values(&[3, 4], 1),
        values(&[4, 8], 2),
        values(&[8], 3),
        values(&[8, 4], 4),
        values(&[4], 5),
    );
    let x = Var::from_tensor(&x0).unwrap();
    let (v1, vb1, v2, vb2) = (
        Var::from_tensor(&w1).unwrap(),
        Var::from_tensor(&b1).unwrap(),
        Var::from_tensor(&w2).unwrap(),
        Var::from_tensor(&b2).unwrap(),
    );
    let hidden = x
        .matmul(&v1)
        .unwrap()
        .broadcast_add(&vb1)
        .unwrap()
        .gelu()
        .unwrap();
    let y = hidden.matmul(&v2).unwrap().broadcast_add(&vb2).unwrap();
    let weights = values(&[3, 4], 6);
    let grads = (&y * &weights)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    for size in [2, 4] {
        on_thread_ranks(size, |rank, comm| {
            let group = group(comm);
            let mut store = ParamStore::new(&Device::Cpu, DType::F64);
            let mut scope: Scope = store.scope("");
            let up =
                ColumnParallelLinear::from_full(&mut scope.sub("up"), &w1, &b1, 1, &group, false)
                    .unwrap();
            let down =
                RowParallelLinear::from_full(&mut scope.sub("down"), &w2, b2.clone(), &group)
                    .unwrap();
            let input = Var::from_tensor(&x0).unwrap();
            let out = down
                .forward(&up.forward(input.as_tensor()).unwrap().gelu().unwrap())
                .unwrap();
            assert!(max_diff(&out, &y) < 1e-12, "rank {rank}: output");
            let local = (&out * &weights)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let dx = local.get(input.as_tensor()).unwrap();
            assert!(
                max_diff(dx, grads.get(x.as_tensor()).unwrap()) < 1e-12,
                "rank {rank}: dx"
            );
            let entries = store.entries();
            let expected = [
                column_slice(grads.get(v1.as_tensor()).unwrap(), 1, rank, size).unwrap(),
                column_slice(grads.get(vb1.as_tensor()).unwrap(), 1, rank, size).unwrap(),
                row_slice(grads.get(v2.as_tensor()).unwrap(), rank, size).unwrap(),
                grads.get(vb2.as_tensor()).unwrap().clone(),
            ];
            for (entry, expected) in entries.iter().zip(&expected) {
                let got = local.get(entry.tensor()).unwrap();
                assert!(
                    max_diff(got, expected) < 1e-12,
                    "rank {rank}: {}",
                    entry.name
                );
            }
        });
    }
}

/// The fused q | k | v columns are cut per group: rank 1 of 2 holds columns 2-3, 6-7, 10-11.
#[test]
fn grouped_columns_are_cut_per_group() {
    let full = Tensor::arange(0f64, 12., &Device::Cpu)
        .unwrap()
        .reshape((1, 12))
        .unwrap();
    let slice = column_slice(&full, 3, 1, 2)
        .unwrap()
        .to_vec2::<f64>()
        .unwrap();
    assert_eq!(slice, [[2., 3., 6., 7., 10., 11.]]);
    let err = column_slice(&full, 3, 0, 3).unwrap_err().to_string();
    assert!(
        err.contains("12 output features") && err.contains("3 ranks"),
        "{err}"
    );
}

/// The gather / scatter pair: gathering the ranks' slices rebuilds the tensor, and its
/// backward hands each rank its slice of the gradient; scattering keeps the slice and its
/// backward gathers the gradient.
#[test]
fn gather_and_scatter_are_conjugate() {
    let full = values(&[2, 6], 7);
    let upstream = values(&[2, 6], 8);
    on_thread_ranks(3, |rank, comm| {
        let group = group(comm);
        let mine = Var::from_tensor(&full.narrow(1, 2 * rank, 2).unwrap()).unwrap();
        let gathered = gather_from_region(mine.as_tensor(), &group).unwrap();
        assert!(max_diff(&gathered, &full) < 1e-15);
        let g = (&gathered * &upstream)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let expected = upstream.narrow(1, 2 * rank, 2).unwrap();
        assert!(max_diff(g.get(mine.as_tensor()).unwrap(), &expected) < 1e-15);

        let whole = Var::from_tensor(&full).unwrap();
        let part = scatter_to_region(whole.as_tensor(), &group).unwrap();
        assert!(max_diff(&part, &full.narrow(1, 2 * rank, 2).unwrap()) < 1e-15);
        let local_up = upstream.narrow(1, 2 * rank, 2).unwrap();
        let g = (&part * &local_up)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        assert!(max_diff(g.get(whole.as_tensor()).unwrap(), &upstream) < 1e-15);
    });
}

/// The sequence-parallel pair: all-gathering the ranks' row blocks rebuilds the tensor and its
/// backward hands each rank the sum over ranks of its block of their gradients; reduce-scatter
/// sums the ranks' tensors keeping this rank's block, and its backward gathers the blocks'
/// gradients (f64, exact sums of small integers).
#[test]
fn all_gather_and_reduce_scatter_are_conjugate() {
    let full = values(&[6, 2], 11);
    let upstream = values(&[6, 2], 12);
    on_thread_ranks(3, |rank, comm| {
        let group = group(comm);
        let weight = (rank + 1) as f64;
        let mine = Var::from_tensor(&full.narrow(0, 2 * rank, 2).unwrap()).unwrap();
        let gathered = all_gather_first(mine.as_tensor(), &group).unwrap();
        assert!(max_diff(&gathered, &full) < 1e-15);
        let own_upstream = (&upstream * weight).unwrap();
        let g = (&gathered * &own_upstream)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let expected = (upstream.narrow(0, 2 * rank, 2).unwrap() * 6.0).unwrap();
        assert!(max_diff(g.get(mine.as_tensor()).unwrap(), &expected) < 1e-12);

        let whole = Var::from_tensor(&(&full * weight).unwrap()).unwrap();
        let summed = reduce_scatter_first(whole.as_tensor(), &group).unwrap();
        let expected = (full.narrow(0, 2 * rank, 2).unwrap() * 6.0).unwrap();
        assert!(max_diff(&summed, &expected) < 1e-12);
        let local_up = (upstream.narrow(0, 2 * rank, 2).unwrap() * weight).unwrap();
        let g = (&summed * &local_up)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let weights = Tensor::new(&[1f64, 1., 2., 2., 3., 3.], &Device::Cpu).unwrap();
        let expected = upstream
            .broadcast_mul(&weights.unsqueeze(1).unwrap())
            .unwrap();
        assert!(max_diff(g.get(whole.as_tensor()).unwrap(), &expected) < 1e-12);
    });
}

/// The vocabulary-parallel embedding and cross-entropy over 2 ranks equal a whole table's
/// lookup, tied head and cross-entropy (the last two rows are padding, masked), with the
/// table's gradient split by rows, in f64 within 1e-12.
#[test]
fn vocabulary_parallel_embedding_and_loss_equal_the_whole_table() {
    let (vocab, rows, width) = (6, 8, 3);
    let table = values(&[rows, width], 9);
    let ids = Tensor::new(&[[0u32, 5, 3], [4, 1, 2]], &Device::Cpu).unwrap();
    let targets = Tensor::new(&[[5u32, 3, 4], [1, 2, 0]], &Device::Cpu).unwrap();
    let whole = Var::from_tensor(&table).unwrap();
    let embedded = whole
        .embedding(&ids.flatten_all().unwrap())
        .unwrap()
        .reshape((2, 3, width))
        .unwrap();
    let h = (embedded.tanh().unwrap() * 2.0).unwrap();
    let logits = h
        .reshape((6, width))
        .unwrap()
        .matmul(&whole.t().unwrap())
        .unwrap();
    let real = logits.narrow(1, 0, vocab).unwrap();
    let loss = candle_nn::loss::cross_entropy(&real, &targets.flatten_all().unwrap()).unwrap();
    let grads = loss.backward().unwrap();
    on_thread_ranks(2, |rank, comm| {
        let group = group(comm);
        let mut store = ParamStore::new(&Device::Cpu, DType::F64);
        let mut scope = store.scope("wte");
        let wte = VocabParallelEmbedding::from_full(&mut scope, &table, &group).unwrap();
        let h = (wte.forward(&ids).unwrap().tanh().unwrap() * 2.0).unwrap();
        let local_logits = wte.logits(&h).unwrap();
        assert_eq!(local_logits.dims(), [2, 3, 4]);
        let ours =
            vocab_parallel_cross_entropy(&local_logits, &targets, wte.start(), vocab, &group)
                .unwrap();
        assert!(max_diff(&ours, &loss) < 1e-12, "rank {rank}: loss");
        let local = ours.backward().unwrap();
        let got = local.get(store.entries()[0].tensor()).unwrap();
        let expected = grads
            .get(whole.as_tensor())
            .unwrap()
            .narrow(0, 4 * rank, 4)
            .unwrap();
        assert!(
            max_diff(got, &expected) < 1e-12,
            "rank {rank}: table gradient"
        );
        // The direct gradient (no graph) is autograd's of 3 × loss, padding columns zero.
        let (direct_loss, direct) = vocab_parallel_cross_entropy_and_grad(
            &local_logits,
            &targets,
            wte.start(),
            vocab,
            &group,
            3.0,
        )
        .unwrap();
        assert!(
            max_diff(&direct_loss, &loss) < 1e-12,
            "rank {rank}: direct loss"
        );
        let leaf = Var::from_tensor(&local_logits.detach()).unwrap();
        let again =
            vocab_parallel_cross_entropy(leaf.as_tensor(), &targets, wte.start(), vocab, &group)
                .unwrap();
        let autograd = (&again * 3.0).unwrap().backward().unwrap();
        let expected = autograd.get(leaf.as_tensor()).unwrap();
        assert!(
            max_diff(&direct, expected) < 1e-12,
            "rank {rank}: direct gradient"
        );
        if rank == 1 {
            let padding = direct.narrow(2, 2, 2).unwrap();
            assert_eq!(max_diff(&padding, &padding.zeros_like().unwrap()), 0.0);
        }
    });
}

/// The group agrees on the step: the squared norm sums the ranks' slices and counts the whole
/// parameters (elements 0..2 here, equal on both ranks) once; a NaN on one rank is seen by all.
#[test]
fn the_strategy_counts_whole_parameters_once_and_shares_found_inf() {
    use crate::strategy::Strategy;
    let model = weft_testing::models::tiny_resnet(0, 2, DType::F64);
    on_thread_ranks(2, |rank, comm| {
        let inner = Box::new(crate::SingleProcess::new(&model, false));
        let mut strategy = TensorParallel::new(inner, group(comm), std::iter::once(0..2).collect());
        // Whole elements (3, 4) on both ranks; slices (1) on rank 0 and (2, 2) on rank 1.
        let grads: &[f64] = match rank {
            0 => &[3., 4., 1., 0., 0.],
            _ => &[3., 4., 0., 2., 2.],
        };
        let squares = Tensor::new(grads, &Device::Cpu).unwrap().sqr().unwrap();
        let local = strategy.local_grad_norm_squared(&squares, 0..5).unwrap();
        let total = strategy.reduce_grad_norm_squared(local).unwrap();
        assert_eq!(total.to_scalar::<f64>().unwrap(), 25.0 + 1.0 + 8.0);
        // Restricted to a shard (elements 1..5, as ZeRO would give): whole element 1 only.
        let shard = squares.narrow(0, 1, 4).unwrap();
        let local = strategy.local_grad_norm_squared(&shard, 1..5).unwrap();
        assert_eq!(
            local.to_scalar::<f64>().unwrap(),
            8.0 + grads[2] * grads[2] + 2.0 * grads[3] * grads[3]
        );
        let flag = Tensor::new(&[if rank == 1 { 1f32 } else { 0. }], &Device::Cpu).unwrap();
        let found = strategy.reduce_found_inf(flag).unwrap();
        assert_eq!(found.to_vec1::<f32>().unwrap(), [1.0]);
    });
}
