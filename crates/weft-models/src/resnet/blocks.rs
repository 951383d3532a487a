//! The blocks of a ResNet: stem, residual blocks (Basic, Bottleneck) and classification head.

use std::ops::Range;

use candle_core::{Tensor, D};
use weft_tensor::{ops, Block, CrossRankSlot, EntryId, ExplicitBackward, Mode, Scope};

use super::config::{BlockKind, Stem as StemKind};
use crate::layers::{BatchNorm2d, Conv2d, Init, Linear};

mod explicit;
mod explicit_head;

/// `conv1 → bn1 → relu (→ maxpool 3x3/2)`, on the input stored channels-last when asked.
pub struct Stem {
    conv1: Conv2d,
    bn1: BatchNorm2d,
    max_pool: bool,
    channels_last: bool,
    entries: Range<EntryId>,
}

impl Stem {
    pub fn new(
        scope: &mut Scope,
        init: &mut Init,
        kind: StemKind,
        width: usize,
        channels_last: bool,
        sync: &CrossRankSlot,
    ) -> crate::Result<Self> {
        let start = scope.store_len();
        let (conv1, max_pool) = match kind {
            StemKind::ImageNet => (
                Conv2d::new(&mut scope.sub("conv1"), init, 3, width, 7, 2, 3)?,
                true,
            ),
            StemKind::Cifar => (
                Conv2d::new(&mut scope.sub("conv1"), init, 3, width, 3, 1, 1)?,
                false,
            ),
        };
        let bn1 = BatchNorm2d::new(&mut scope.sub("bn1"), width, false, sync)?;
        Ok(Self {
            conv1,
            bn1,
            max_pool,
            channels_last,
            entries: start..scope.store_len(),
        })
    }
}

impl Stem {
    /// The input in the layout the blocks run in.
    fn in_layout(&self, x: &Tensor) -> weft_tensor::Result<Tensor> {
        Ok(match self.channels_last {
            true => ops::to_channels_last(x)?,
            false => x.clone(),
        })
    }
}

/// Whether a block's forward on `x` may use the graph-free kernels: inference (nothing to
/// differentiate) on tensors they take; they keep channels-last data channels-last.
fn graph_free(x: &Tensor, mode: Mode) -> bool {
    !mode.differentiable && ops::has_kernels(x)
}

impl Block for Stem {
    fn name(&self) -> &str {
        "stem"
    }

    fn forward(&self, x: &Tensor, mode: Mode) -> weft_tensor::Result<Tensor> {
        let x = self.in_layout(x)?;
        let h = self.bn1.forward_relu(&self.conv1.forward(&x)?, mode)?;
        Ok(match (self.max_pool, graph_free(&h, mode)) {
            (true, true) => ops::max_pool2d_forward(&h, 3, 2, 1)?,
            (true, false) => ops::max_pool2d(&h, 3, 2, 1)?,
            (false, _) => h,
        })
    }

    fn entries(&self) -> Range<EntryId> {
        self.entries.clone()
    }

    fn explicit(&self) -> Option<&dyn ExplicitBackward> {
        Some(self)
    }
}

/// A residual block: a convolution branch plus an identity or 1x1-conv shortcut, then ReLU.
pub struct Residual {
    name: String,
    branch: Vec<(Conv2d, BatchNorm2d)>,
    downsample: Option<(Conv2d, BatchNorm2d)>,
    entries: Range<EntryId>,
}

/// Shape of one residual block.
pub struct ResidualSpec {
    pub kind: BlockKind,
    pub in_ch: usize,
    pub planes: usize,
    pub stride: usize,
    pub zero_init_residual: bool,
    /// The model's SyncBatchNorm slot.
    pub sync: CrossRankSlot,
}

impl Residual {
    /// Registers the block under `scope` (e.g. `layer2.0`) with torchvision's names.
    pub fn new(
        scope: &mut Scope,
        init: &mut Init,
        name: String,
        spec: &ResidualSpec,
    ) -> crate::Result<Self> {
        let start = scope.store_len();
        let out_ch = spec.planes * spec.kind.expansion();
        // (in, out, kernel, stride, padding) of each convolution of the branch.
        let convs = match spec.kind {
            BlockKind::Basic => vec![
                (spec.in_ch, spec.planes, 3, spec.stride, 1),
                (spec.planes, spec.planes, 3, 1, 1),
            ],
            BlockKind::Bottleneck => vec![
                (spec.in_ch, spec.planes, 1, 1, 0),
                (spec.planes, spec.planes, 3, spec.stride, 1),
                (spec.planes, out_ch, 1, 1, 0),
            ],
        };
        let last = convs.len();
        let mut branch = Vec::with_capacity(last);
        for (i, (cin, cout, k, s, p)) in convs.into_iter().enumerate() {
            let conv = Conv2d::new(
                &mut scope.sub(&format!("conv{}", i + 1)),
                init,
                cin,
                cout,
                k,
                s,
                p,
            )?;
            let zero = spec.zero_init_residual && i + 1 == last;
            let bn = BatchNorm2d::new(
                &mut scope.sub(&format!("bn{}", i + 1)),
                cout,
                zero,
                &spec.sync,
            )?;
            branch.push((conv, bn));
        }
        let downsample = if spec.stride != 1 || spec.in_ch != out_ch {
            let mut ds = scope.sub("downsample");
            let conv = Conv2d::new(
                &mut ds.sub("0"),
                init,
                spec.in_ch,
                out_ch,
                1,
                spec.stride,
                0,
            )?;
            let bn = BatchNorm2d::new(&mut ds.sub("1"), out_ch, false, &spec.sync)?;
            Some((conv, bn))
        } else {
            None
        };
        Ok(Self {
            name,
            branch,
            downsample,
            entries: start..scope.store_len(),
        })
    }
}

impl Block for Residual {
    fn name(&self) -> &str {
        &self.name
    }

    fn forward(&self, x: &Tensor, mode: Mode) -> weft_tensor::Result<Tensor> {
        let mut h = x.clone();
        let last = self.branch.len() - 1;
        for (i, (conv, bn)) in self.branch.iter().enumerate() {
            let z = conv.forward(&h)?;
            h = if i == last {
                bn.forward(&z, mode)?
            } else {
                bn.forward_relu(&z, mode)?
            };
        }
        let shortcut = match &self.downsample {
            Some((conv, bn)) => bn.forward(&conv.forward(x)?, mode)?,
            None => x.clone(),
        };
        Ok(match graph_free(&h, mode) {
            true => ops::add_relu_forward(&h, &shortcut)?,
            false => ops::add_relu(&h, &shortcut)?,
        })
    }

    fn entries(&self) -> Range<EntryId> {
        self.entries.clone()
    }

    fn explicit(&self) -> Option<&dyn ExplicitBackward> {
        Some(self)
    }
}

/// The mean over the spatial axes in the order of x's storage: channels-last x as its
/// N x (H*W) x C view, so neither the forward nor its gradient copies between layouts.
fn spatial_mean(x: &Tensor) -> candle_core::Result<Tensor> {
    match ops::is_channels_last(x) {
        true => x.permute((0, 2, 3, 1))?.flatten(1, 2)?.mean(1),
        false => x.contiguous()?.mean(D::Minus1)?.mean(D::Minus1),
    }
}

/// Global average pooling then the fully connected classifier `fc`.
pub struct Head {
    fc: Linear,
    entries: Range<EntryId>,
}

impl Head {
    pub fn new(
        scope: &mut Scope,
        init: &mut Init,
        features: usize,
        num_classes: usize,
    ) -> crate::Result<Self> {
        let start = scope.store_len();
        let fc = Linear::new(&mut scope.sub("fc"), init, features, num_classes)?;
        Ok(Self {
            fc,
            entries: start..scope.store_len(),
        })
    }
}

impl Block for Head {
    fn name(&self) -> &str {
        "head"
    }

    fn forward(&self, x: &Tensor, _mode: Mode) -> weft_tensor::Result<Tensor> {
        self.fc.forward(&spatial_mean(x)?)
    }

    fn entries(&self) -> Range<EntryId> {
        self.entries.clone()
    }

    fn explicit(&self) -> Option<&dyn ExplicitBackward> {
        Some(self)
    }
}
