//! Channels-last tensors through the graph-free kernels on the CPU: the layout is recognised,
//! kept by the element-wise passes and max-pool, and the values equal those of NCHW tensors.

use super::support::{seeded, values};
use crate::ops::{
    add_relu_forward, is_channels_last, max_pool2d_backward, max_pool2d_backward_saved,
    max_pool2d_forward, max_pool2d_forward_saving, relu_backward, to_channels_last,
};
use candle_core::Result;

#[test]
fn layout_is_recognised_and_values_are_kept() -> Result<()> {
    let x = seeded(&[2, 3, 4, 5], 1);
    assert!(!is_channels_last(&x));
    let cl = to_channels_last(&x)?;
    assert!(is_channels_last(&cl));
    assert_eq!(cl.dims(), x.dims());
    assert_eq!(values(&cl), values(&x));
    assert!(is_channels_last(&to_channels_last(&cl)?));
    // One channel: NCHW and NHWC are the same order, a plain contiguous tensor.
    assert!(!is_channels_last(&to_channels_last(&seeded(
        &[2, 1, 4, 5],
        2
    ))?));
    assert!(!is_channels_last(&seeded(&[6, 5], 3)));
    Ok(())
}

#[test]
fn element_wise_passes_and_max_pool_keep_the_layout_of_their_input() -> Result<()> {
    let (a, b) = (seeded(&[2, 3, 6, 6], 4), seeded(&[2, 3, 6, 6], 5));
    let cl = to_channels_last(&a)?;
    let sum = add_relu_forward(&cl, &b)?;
    assert!(is_channels_last(&sum));
    assert_eq!(values(&sum), values(&add_relu_forward(&a, &b)?));
    let g = relu_backward(&sum, &b)?;
    assert!(is_channels_last(&g));
    assert_eq!(
        values(&g),
        values(&relu_backward(&add_relu_forward(&a, &b)?, &b)?)
    );
    let y = max_pool2d_forward(&cl, 3, 2, 1)?;
    assert!(is_channels_last(&y));
    assert_eq!(values(&y), values(&max_pool2d_forward(&a, 3, 2, 1)?));
    let dy = seeded(y.dims(), 6);
    let dx = max_pool2d_backward(&cl, &y, &dy, 3, 2, 1)?;
    assert!(is_channels_last(&dx));
    let y_nchw = max_pool2d_forward(&a, 3, 2, 1)?;
    assert_eq!(
        values(&dx),
        values(&max_pool2d_backward(&a, &y_nchw, &dy, 3, 2, 1)?)
    );
    // Through what the forward saves (on the CPU, the output itself).
    let (y_saving, saved) = max_pool2d_forward_saving(&cl, 3, 2, 1)?;
    assert_eq!(values(&y_saving), values(&y));
    let dx_saved = max_pool2d_backward_saved(&cl, &saved, &dy, 3, 2, 1)?;
    assert!(is_channels_last(&dx_saved));
    assert_eq!(values(&dx_saved), values(&dx));
    Ok(())
}
