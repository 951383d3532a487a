//! The CPU kernels of `embed_tokens` against hand-computed rows, finite differences in f64 and
//! naive loops, with ids repeated and absent; ids past the table are one-line errors.

use candle_core::{DType, Device, Result, Tensor};

use super::{embed_tokens, embed_tokens_backward};

/// Values in `[-1, 1)` from a fixed sequence (no generator needed for a few dozen).
fn values(len: usize, seed: usize) -> Vec<f64> {
    (0..len)
        .map(|i| (((i + seed) * 7919 + seed * 104_729) % 2000) as f64 / 1000.0 - 1.0)
        .collect()
}

fn f64_tensor(shape: (usize, usize), seed: usize) -> Tensor {
    Tensor::from_vec(values(shape.0 * shape.1, seed), shape, &Device::Cpu).unwrap()
}

fn flat(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1())
        .unwrap()
}

/// `[[1, 1, 4], [1, 1, 1]]`: id 1 five times, id 4 once, ids 0, 2, 3 and 5 absent.
fn repeated_ids() -> Tensor {
    Tensor::new(&[[1u32, 1, 4], [1, 1, 1]], &Device::Cpu).unwrap()
}

#[test]
fn forward_by_hand() -> Result<()> {
    let table = Tensor::new(&[[1f64, 2.0], [10.0, 20.0], [100.0, 50.0]], &Device::Cpu)?;
    // Three positions for sequences of two: the last is not read.
    let positions = Tensor::new(&[[0.5f64, -0.5], [2.0, -2.0], [9.0, 9.0]], &Device::Cpu)?;
    let ids = Tensor::new(&[[2u32, 0], [2, 2]], &Device::Cpu)?;
    let out = embed_tokens(&table, &positions, &ids)?;
    assert_eq!(out.dims(), [2, 2, 2]);
    let expected = [100.5, 49.5, 3.0, 0.0, 100.5, 49.5, 102.0, 48.0];
    assert_eq!(flat(&out), expected);
    // f32 and bf16 give the same sums, rounded once (all of them exact here).
    for dtype in [DType::F32, DType::BF16] {
        let narrow = |t: &Tensor| t.to_dtype(dtype);
        let out = embed_tokens(&narrow(&table)?, &narrow(&positions)?, &ids)?;
        assert_eq!(out.dtype(), dtype);
        assert_eq!(flat(&out), expected);
    }
    Ok(())
}

/// The gradients of `Σ w ⊙ embed_tokens(table, positions, ids)` against central differences
/// in f64 over every table and position element (the loss is linear in them: the difference
/// is exact up to rounding, ~1e-10 at step 1e-6).
#[test]
fn backward_matches_finite_differences_in_f64() -> Result<()> {
    let (vocab, position_rows, cols) = (6, 5, 4);
    let ids = repeated_ids();
    let table = f64_tensor((vocab, cols), 1);
    let positions = f64_tensor((position_rows, cols), 2);
    let weights = Tensor::from_vec(values(2 * 3 * cols, 3), (2, 3, cols), &Device::Cpu)?;
    let loss = |table: &Tensor, positions: &Tensor| -> f64 {
        let out = embed_tokens(table, positions, &ids).unwrap();
        (out * &weights)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar()
            .unwrap()
    };
    let (d_table, d_positions) = embed_tokens_backward(&ids, &weights, vocab, position_rows)?;
    assert_eq!(d_table.dims(), [vocab, cols]);
    assert_eq!(d_positions.dims(), [position_rows, cols]);
    let step = 1e-6;
    let numeric = |which: usize, base: &Tensor| -> Vec<f64> {
        let v = flat(base);
        (0..v.len())
            .map(|k| {
                let at = |delta: f64| {
                    let mut w = v.clone();
                    w[k] += delta;
                    let moved = Tensor::from_vec(w, base.dims(), &Device::Cpu).unwrap();
                    match which {
                        0 => loss(&moved, &positions),
                        _ => loss(&table, &moved),
                    }
                };
                (at(step) - at(-step)) / (2.0 * step)
            })
            .collect()
    };
    for (what, analytic, expected) in [
        ("table", flat(&d_table), numeric(0, &table)),
        ("positions", flat(&d_positions), numeric(1, &positions)),
    ] {
        for (k, (a, e)) in analytic.iter().zip(&expected).enumerate() {
            assert!((a - e).abs() < 1e-8, "{what}[{k}]: {a} vs {e}");
        }
    }
    // Absent ids and positions past the sequence have exactly zero gradients.
    let rows = d_table.to_vec2::<f64>()?;
    for v in [0, 2, 3, 5] {
        assert!(rows[v].iter().all(|&g| g == 0.0), "id {v}");
    }
    let rows = d_positions.to_vec2::<f64>()?;
    assert!(rows[3..].iter().flatten().all(|&g| g == 0.0));
    Ok(())
}

/// Each token's `cols` gradients added into its id's row and its position's, in token order,
/// in f64: `(d_table, d_positions)`.
fn naive_backward(ids: &[u32], g: &[f64], shape: [usize; 4]) -> (Vec<f64>, Vec<f64>) {
    let [t, cols, vocab, position_rows] = shape;
    let mut d_table = vec![0f64; vocab * cols];
    let mut d_positions = vec![0f64; position_rows * cols];
    for (i, &id) in ids.iter().enumerate() {
        for c in 0..cols {
            d_table[id as usize * cols + c] += g[i * cols + c];
            d_positions[(i % t) * cols + c] += g[i * cols + c];
        }
    }
    (d_table, d_positions)
}

/// Against [`naive_backward`]: equal bit for bit in f64, and in f32 (the CPU sums f32 in f64
/// and rounds once, as the loop's result is rounded); in bf16 the f32 result on the same
/// rounded values, rounded once.
#[test]
fn backward_equals_a_naive_loop() -> Result<()> {
    let (b, t, cols, vocab, position_rows) = (3, 7, 5, 9, 8);
    // Ids (i² mod 7): 0, 1, 2 and 4 repeated, 3, 5 and 6 absent; 7 and 8 never drawn.
    let id_values: Vec<u32> = (0..b * t).map(|i| ((i * i) % 7) as u32).collect();
    let ids = Tensor::from_vec(id_values.clone(), (b, t), &Device::Cpu)?;
    let dy = Tensor::from_vec(values(b * t * cols, 4), (b, t, cols), &Device::Cpu)?;
    let shape = [t, cols, vocab, position_rows];
    let round = |v: &[f64], dtype: DType| -> Vec<f64> {
        flat(
            &Tensor::new(v, &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap(),
        )
    };
    for dtype in [DType::F64, DType::F32] {
        let dy = dy.to_dtype(dtype)?;
        let (d_table, d_positions) = naive_backward(&id_values, &flat(&dy), shape);
        let (table, positions) = embed_tokens_backward(&ids, &dy, vocab, position_rows)?;
        assert_eq!(flat(&table), round(&d_table, dtype), "{dtype:?}");
        assert_eq!(flat(&positions), round(&d_positions, dtype), "{dtype:?}");
    }
    let dy_16 = dy.to_dtype(DType::BF16)?;
    let (table_16, positions_16) = embed_tokens_backward(&ids, &dy_16, vocab, position_rows)?;
    let (table_wide, positions_wide) =
        embed_tokens_backward(&ids, &dy_16.to_dtype(DType::F32)?, vocab, position_rows)?;
    assert_eq!(table_16.dtype(), DType::BF16);
    assert_eq!(flat(&table_16), round(&flat(&table_wide), DType::BF16));
    assert_eq!(
        flat(&positions_16),
        round(&flat(&positions_wide), DType::BF16)
    );
    Ok(())
}

#[test]
fn an_id_past_the_table_is_a_one_line_error() -> Result<()> {
    let table = f64_tensor((6, 4), 1);
    let positions = f64_tensor((3, 4), 2);
    let ids = Tensor::new(&[[1u32, 6, 2]], &Device::Cpu)?;
    let forward = embed_tokens(&table, &positions, &ids)
        .unwrap_err()
        .to_string();
    let dy = Tensor::zeros((1, 3, 4), DType::F64, &Device::Cpu)?;
    let backward = embed_tokens_backward(&ids, &dy, 6, 3)
        .unwrap_err()
        .to_string();
    for err in [forward, backward] {
        let first = err.lines().next().unwrap_or_default();
        assert!(
            first.contains("token 1 has id 6") && first.contains("6 rows"),
            "{err}"
        );
    }
    Ok(())
}
