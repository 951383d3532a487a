//! The ZeRO-shard property: stepping disjoint pieces of a flat buffer with separate optimizers
//! is bit-identical to stepping the whole buffer with one, for any split, param groups
//! included (restricted to the piece, or the whole buffer's stepped at the piece's offset), and
//! whether or not the whole-buffer step runs in parallel chunks.

use std::ops::Range;

use proptest::prelude::*;
use proptest::sample::Index;
use weft_optim::{AdamW, AdamWConfig, Optimizer, ParamGroup, ParamGroups, Sgd, SgdConfig, Shard};

/// Steps `params` with one optimizer over the whole buffer and with one optimizer per piece
/// (`cuts` split the buffer), and asserts the results are bit-identical.
fn assert_pieces_match_whole<O: Optimizer>(
    make: impl Fn(ParamGroups) -> O,
    groups: &ParamGroups,
    params: &[f32],
    grads: &[Vec<f32>],
    cuts: &[usize],
) {
    let mut whole_optimizer = make(groups.clone());
    let mut whole = params.to_vec();
    for grad in grads {
        whole_optimizer.step(&mut whole, grad).unwrap();
    }
    let mut pieces = params.to_vec();
    for piece in pieces_of(params.len(), cuts) {
        let mut optimizer = make(groups.restricted_to(piece.clone()));
        for grad in grads {
            optimizer
                .step(&mut pieces[piece.clone()], &grad[piece.clone()])
                .unwrap();
        }
    }
    assert_eq!(whole, pieces);
    // The same with the whole buffer's groups, each piece stepped at its offset.
    let mut at_offsets = params.to_vec();
    for piece in pieces_of(params.len(), cuts) {
        let mut optimizer = make(groups.clone());
        let shard = Shard {
            offset: piece.start,
            buffer_len: params.len(),
        };
        for grad in grads {
            optimizer
                .step_at(shard, &mut at_offsets[piece.clone()], &grad[piece.clone()])
                .unwrap();
        }
    }
    assert_eq!(whole, at_offsets);
}

fn pieces_of(len: usize, cuts: &[usize]) -> Vec<Range<usize>> {
    let mut bounds: Vec<usize> = cuts.iter().copied().filter(|&cut| cut < len).collect();
    bounds.extend([0, len]);
    bounds.sort_unstable();
    bounds.dedup();
    bounds.windows(2).map(|pair| pair[0]..pair[1]).collect()
}

fn sgd(config: SgdConfig) -> impl Fn(ParamGroups) -> Sgd {
    move |groups| Sgd::new(config.clone()).unwrap().with_param_groups(groups)
}

fn adamw(config: AdamWConfig) -> impl Fn(ParamGroups) -> AdamW {
    move |groups| {
        AdamW::new(config.clone())
            .unwrap()
            .with_param_groups(groups)
    }
}

fn no_decay_groups() -> ParamGroups {
    ParamGroups::new(vec![
        ParamGroup {
            range: 2..5,
            weight_decay: 0.0,
            lr_scale: 1.0,
        },
        ParamGroup {
            range: 8..9,
            weight_decay: 0.0,
            lr_scale: 0.1,
        },
    ])
    .unwrap()
}

#[test]
fn two_shards_match_the_whole_buffer() {
    let params: Vec<f32> = (0..10).map(|i| i as f32 * 0.3 - 1.0).collect();
    let grads: Vec<Vec<f32>> = (0..3)
        .map(|s| {
            (0..10)
                .map(|i| ((i * 7 + s * 3) % 5) as f32 - 2.0)
                .collect()
        })
        .collect();
    let momentum = SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        weight_decay: 1e-2,
        ..Default::default()
    };
    for cut in [0, 3, 4, 8, 10] {
        assert_pieces_match_whole(
            sgd(momentum.clone()),
            &no_decay_groups(),
            &params,
            &grads,
            &[cut],
        );
        assert_pieces_match_whole(
            adamw(AdamWConfig::default()),
            &no_decay_groups(),
            &params,
            &grads,
            &[cut],
        );
    }
}

#[test]
fn a_parallel_whole_step_matches_sequential_pieces() {
    // Over 2^20 elements the whole-buffer step runs in parallel chunks; pieces of 600k don't.
    let len = (1 << 21) + 3;
    let params: Vec<f32> = (0..len).map(|i| ((i % 97) as f32 - 48.0) * 0.01).collect();
    let grads: Vec<Vec<f32>> = (0..2)
        .map(|s| (0..len).map(|i| ((i * 31 + s) % 13) as f32 - 6.0).collect())
        .collect();
    let cuts: Vec<usize> = (1..4).map(|k| k * 600_000).collect();
    let config = AdamWConfig {
        amsgrad: true,
        ..Default::default()
    };
    assert_pieces_match_whole(
        adamw(config),
        &ParamGroups::default(),
        &params,
        &grads,
        &cuts,
    );
    let nesterov = SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        nesterov: true,
        ..Default::default()
    };
    assert_pieces_match_whole(
        sgd(nesterov),
        &ParamGroups::default(),
        &params,
        &grads,
        &cuts,
    );
}

fn buffers(max_len: usize) -> impl Strategy<Value = (Vec<f32>, Vec<Vec<f32>>)> {
    (1..max_len).prop_flat_map(|len| {
        let values = || prop::collection::vec(-10.0_f32..10.0, len);
        (values(), prop::collection::vec(values(), 1..4))
    })
}

fn cut_points() -> impl Strategy<Value = Vec<Index>> {
    prop::collection::vec(any::<Index>(), 0..4)
}

proptest! {
    #[test]
    fn sgd_pieces_match_whole(
        (params, grads) in buffers(48),
        cuts in cut_points(),
        momentum in 0.0..0.99_f64,
        dampening in 0.0..0.5_f64,
        weight_decay in 0.0..0.1_f64,
        nesterov in any::<bool>(),
        maximize in any::<bool>(),
    ) {
        let dampening = if nesterov { 0.0 } else { dampening };
        let momentum = if nesterov { momentum + 0.01 } else { momentum };
        let config = SgdConfig { lr: 0.05, momentum, dampening, weight_decay, nesterov, maximize };
        let cuts: Vec<usize> = cuts.iter().map(|cut| cut.index(params.len())).collect();
        let groups = no_decay_groups().restricted_to(0..params.len());
        assert_pieces_match_whole(sgd(config), &groups, &params, &grads, &cuts);
    }

    #[test]
    fn adamw_pieces_match_whole(
        (params, grads) in buffers(48),
        cuts in cut_points(),
        beta1 in 0.0..0.99_f64,
        beta2 in 0.9..0.9999_f64,
        weight_decay in 0.0..0.1_f64,
        amsgrad in any::<bool>(),
    ) {
        let config = AdamWConfig { lr: 0.01, betas: (beta1, beta2), eps: 1e-8, weight_decay, amsgrad };
        let cuts: Vec<usize> = cuts.iter().map(|cut| cut.index(params.len())).collect();
        let groups = no_decay_groups().restricted_to(0..params.len());
        assert_pieces_match_whole(adamw(config), &groups, &params, &grads, &cuts);
    }
}
