//! The space-to-depth lowering of stride-2 convolutions over few channels (`conv_space_to_depth`)
//! against the convolution itself, on the CPU kernels in f64: output, filter gradient and input
//! gradient (in both layouts) of the lowered problem equal the direct ones up to the order of
//! the additions (1e-12 relative); the filter gradient comes back stored channels-last.

use super::support::{assert_close, seeded, values};
use crate::ops::channels_last::{is_channels_last, to_channels_last};
use crate::ops::conv2d::conv_problem;
use crate::ops::conv_space_to_depth::SpaceToDepth;
use crate::ops::{conv2d_backward, conv2d_forward};
use candle_core::{DType, Result};

/// (x shape, w shape, padding), stride 2: the ImageNet stem on a small image, odd sizes (the
/// blocks then reach past the image), one and four channels, 3 x 3 and 5 x 5 kernels,
/// padding 0 and a rectangular image.
const CASES: &[([usize; 4], [usize; 4], usize)] = &[
    ([2, 3, 16, 16], [5, 3, 7, 7], 3),
    ([1, 3, 15, 13], [4, 3, 7, 7], 3),
    ([2, 1, 9, 9], [3, 1, 3, 3], 1),
    ([1, 4, 10, 11], [2, 4, 5, 5], 2),
    ([2, 2, 8, 8], [3, 2, 3, 3], 0),
];

#[test]
fn the_lowered_convolution_equals_the_stride_2_one() -> Result<()> {
    for (i, &(x_dims, w_dims, padding)) in CASES.iter().enumerate() {
        let seed = 100 + 3 * i as u64;
        let (x, w) = (seeded(&x_dims, seed), seeded(&w_dims, seed + 1));
        let problem = conv_problem(x.dims(), w.dims(), 2, padding)?;
        let lowering = SpaceToDepth::for_geometry(&problem).expect("stride 2 over <= 4 channels");
        let lowered = lowering.lowered()?;
        let (blocks, filter) = (lowering.input(&x)?, lowering.filter(&w)?);
        assert_eq!(
            blocks.dims(),
            [lowered.batch, 16, lowered.geom.in_h, lowered.geom.in_w]
        );
        assert!(
            is_channels_last(&blocks),
            "case {i}: the blocks are channels-last"
        );
        assert_eq!(
            filter.dims(),
            [w_dims[0], 16, lowered.geom.k_h, lowered.geom.k_w]
        );
        assert!(
            is_channels_last(&filter),
            "case {i}: the lowered filter is channels-last"
        );

        let y = conv2d_forward(&x, &w, 2, padding)?;
        let y_lowered = conv2d_forward(&blocks, &filter, 1, 0)?;
        assert_eq!(y.dims(), y_lowered.dims(), "case {i}: output shape");
        assert_close(
            &values(&y_lowered),
            &values(&y),
            1e-12,
            &format!("case {i}: output"),
        );

        let dy = seeded(y.dims(), seed + 2);
        let (dx, dw) = conv2d_backward(&x, &w, &dy, 2, padding, true)?;
        let (blocks_dx, blocks_dw) = conv2d_backward(&blocks, &filter, &dy, 1, 0, true)?;
        let dw_lowered = lowering.filter_grad(&blocks_dw)?;
        assert_eq!(dw_lowered.dims(), w.dims());
        assert_eq!(
            is_channels_last(&dw_lowered),
            w_dims[1] > 1,
            "case {i}: dw is stored channels-last, as the NHWC passes give it"
        );
        assert_close(
            &values(&dw_lowered),
            &values(&dw),
            1e-12,
            &format!("case {i}: dw"),
        );
        let dx = dx.expect("asked for");
        for channels_last in [false, true] {
            let dx_lowered =
                lowering.input_grad(&blocks_dx.clone().expect("asked for"), channels_last)?;
            assert_eq!(dx_lowered.dims(), x.dims());
            // One channel is stored alike in both layouts (contiguous, which is not
            // channels-last by `is_channels_last`'s reckoning).
            let layout_shows = x_dims[1] > 1;
            assert_eq!(
                is_channels_last(&dx_lowered),
                channels_last && layout_shows,
                "case {i}: dx layout"
            );
            assert_close(
                &values(&dx_lowered),
                &values(&dx),
                1e-12,
                &format!("case {i}: dx"),
            );
        }
    }
    Ok(())
}

#[test]
fn a_channels_last_input_gives_the_same_blocks() -> Result<()> {
    let (x_dims, w_dims, padding) = CASES[0];
    let x = seeded(&x_dims, 7);
    let problem = conv_problem(&x_dims, &w_dims, 2, padding)?;
    let lowering = SpaceToDepth::for_geometry(&problem).expect("applies");
    let from_nchw = lowering.input(&x)?;
    let from_channels_last = lowering.input(&to_channels_last(&x)?)?;
    assert_eq!(values(&from_nchw), values(&from_channels_last));
    Ok(())
}

#[test]
fn only_bf16_stride_2_over_few_channels_is_lowered() -> Result<()> {
    let applies = |x: [usize; 4], w: [usize; 4], stride| -> Result<bool> {
        Ok(SpaceToDepth::for_geometry(&conv_problem(&x, &w, stride, 1)?).is_some())
    };
    assert!(applies([1, 3, 8, 8], [4, 3, 3, 3], 2)?);
    let problem = conv_problem(&[1, 3, 8, 8], &[4, 3, 3, 3], 2, 1)?;
    assert!(SpaceToDepth::for_problem(&problem, DType::BF16).is_some());
    for dtype in [DType::F16, DType::F32] {
        assert!(
            SpaceToDepth::for_problem(&problem, dtype).is_none(),
            "{dtype:?} runs as it is"
        );
    }
    assert!(!applies([1, 3, 8, 8], [4, 3, 3, 3], 1)?, "stride 1");
    assert!(!applies([1, 8, 8, 8], [4, 8, 3, 3], 2)?, "eight channels");
    assert!(!applies([1, 3, 8, 8], [4, 3, 1, 1], 2)?, "a 1 x 1 kernel");
    Ok(())
}
