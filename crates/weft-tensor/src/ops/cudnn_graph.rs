//! A cuDNN operation graph described node by node over the backend layer (`cudnn_backend`), as
//! cudnn-frontend's `Graph` lowers its nodes: tensors (in memory, virtual, or scalars passed by
//! value), pointwise operations, matrix products, reductions, reshapes and random Bernoulli masks,
//! added in the order they run. cuDNN matches the whole graph against its fused engines (the flash
//! attention's, `sdpa_graph`), so each node carries exactly the types, shapes and strides the
//! frontend gives it.

use cudarc::cudnn::result::CudnnResult;
use cudarc::cudnn::sys;

use sys::cudnnBackendAttributeName_t as Attr;
use sys::cudnnBackendAttributeType_t as Type;
use sys::cudnnBackendDescriptorType_t as Kind;
use sys::cudnnDataType_t as Data;

use super::cudnn_backend::{tensor_with, Descriptor};

/// A tensor of the graph: where its descriptor is, its unique id, shape, strides and type.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Node {
    index: usize,
    pub uid: i64,
    pub dims: [i64; 4],
    pub strides: [i64; 4],
    pub dtype: Data,
}

/// The row-major strides of `dims`.
pub(crate) fn packed(dims: [i64; 4]) -> [i64; 4] {
    [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1]
}

/// The tensors and operations of a graph being described.
pub(crate) struct GraphBuilder {
    tensors: Vec<Descriptor>,
    ops: Vec<Descriptor>,
    next_virtual: i64,
}

impl GraphBuilder {
    /// An empty graph whose virtual tensors take unique ids from `first_virtual_uid` on.
    pub fn new(first_virtual_uid: i64) -> Self {
        Self {
            tensors: Vec::new(),
            ops: Vec::new(),
            next_virtual: first_virtual_uid,
        }
    }

    fn tensor(&mut self, node: Node, is_virtual: bool, by_value: bool) -> CudnnResult<Node> {
        let shape = (&node.dims[..], &node.strides[..]);
        let d = tensor_with(node.uid, node.dtype, shape, is_virtual, by_value)?;
        self.tensors.push(d);
        Ok(Node {
            index: self.tensors.len() - 1,
            ..node
        })
    }

    /// An operation of `kind` with its tensors (`ports`) and other descriptors (`settings`).
    fn operation(
        &mut self,
        kind: Kind,
        ports: &[(Attr, &Node)],
        settings: &[(Attr, &Descriptor)],
    ) -> CudnnResult<()> {
        let mut op = Descriptor::new(kind)?;
        for (name, node) in ports {
            op.set_descriptors(*name, &[&self.tensors[node.index]])?;
        }
        for (name, descriptor) in settings {
            op.set_descriptors(*name, &[descriptor])?;
        }
        self.ops.push(op.finalize()?);
        Ok(())
    }

    /// A tensor in memory (an input or an output of the graph).
    pub fn memory(
        &mut self,
        uid: i64,
        dtype: Data,
        dims: [i64; 4],
        strides: [i64; 4],
    ) -> CudnnResult<Node> {
        let node = Node {
            index: 0,
            uid,
            dims,
            strides,
            dtype,
        };
        self.tensor(node, false, false)
    }

    /// A scalar passed by value at execution (a host pointer in the variant pack), shaped
    /// `[1, 1, 1, 1]` as the frontend expands its fused scalars.
    pub fn scalar(&mut self, uid: i64, dtype: Data) -> CudnnResult<Node> {
        let node = Node {
            index: 0,
            uid,
            dims: [1; 4],
            strides: [1; 4],
            dtype,
        };
        self.tensor(node, false, true)
    }

    /// An intermediate the fused kernel keeps inside.
    pub fn virt(&mut self, dtype: Data, dims: [i64; 4], strides: [i64; 4]) -> CudnnResult<Node> {
        let uid = self.next_virtual;
        self.next_virtual += 1;
        let node = Node {
            index: 0,
            uid,
            dims,
            strides,
            dtype,
        };
        self.tensor(node, true, false)
    }

    /// A virtual tensor shaped as `like`, of `dtype`.
    pub fn virt_like(&mut self, like: &Node, dtype: Data) -> CudnnResult<Node> {
        self.virt(dtype, like.dims, like.strides)
    }

    /// `out = mode(inputs…)` computed in `compute` (`axis` for GEN_INDEX); inputs are the
    /// operation's x, b and t (BINARY_SELECT's condition) in that order.
    pub fn pointwise(
        &mut self,
        mode: sys::cudnnPointwiseMode_t,
        inputs: &[&Node],
        out: &Node,
        compute: Data,
        axis: Option<i64>,
    ) -> CudnnResult<()> {
        let mut pw = Descriptor::new(Kind::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
        // SAFETY: POINTWISE_MODE attributes are cudnnPointwiseMode_t.
        unsafe {
            pw.set(
                Attr::CUDNN_ATTR_POINTWISE_MODE,
                Type::CUDNN_TYPE_POINTWISE_MODE,
                &[mode],
            )?
        };
        pw.set_data_type(Attr::CUDNN_ATTR_POINTWISE_MATH_PREC, compute)?;
        if let Some(axis) = axis {
            pw.set_i64s(Attr::CUDNN_ATTR_POINTWISE_AXIS, &[axis])?;
        }
        let pw = pw.finalize()?;
        let ports = [
            Attr::CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
            Attr::CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
            Attr::CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
        ];
        let mut tensors: Vec<(Attr, &Node)> =
            ports.into_iter().zip(inputs.iter().copied()).collect();
        tensors.push((Attr::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, out));
        let settings = [(Attr::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &pw)];
        self.operation(
            Kind::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
            &tensors,
            &settings,
        )
    }

    /// `c = a b` over the last two dimensions (the first two broadcast), accumulated in f32.
    pub fn matmul(&mut self, a: &Node, b: &Node, c: &Node) -> CudnnResult<()> {
        let mut mm = Descriptor::new(Kind::CUDNN_BACKEND_MATMUL_DESCRIPTOR)?;
        mm.set_data_type(Attr::CUDNN_ATTR_MATMUL_COMP_TYPE, Data::CUDNN_DATA_FLOAT)?;
        let mm = mm.finalize()?;
        let ports = [
            (Attr::CUDNN_ATTR_OPERATION_MATMUL_ADESC, a),
            (Attr::CUDNN_ATTR_OPERATION_MATMUL_BDESC, b),
            (Attr::CUDNN_ATTR_OPERATION_MATMUL_CDESC, c),
        ];
        let settings = [(Attr::CUDNN_ATTR_OPERATION_MATMUL_DESC, &mm)];
        self.operation(
            Kind::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR,
            &ports,
            &settings,
        )
    }

    /// `y = reduce(x)` over the dimensions where `y` is 1, in f32.
    pub fn reduction(
        &mut self,
        operator: sys::cudnnReduceTensorOp_t,
        x: &Node,
        y: &Node,
    ) -> CudnnResult<()> {
        let mut red = Descriptor::new(Kind::CUDNN_BACKEND_REDUCTION_DESCRIPTOR)?;
        red.set_data_type(Attr::CUDNN_ATTR_REDUCTION_COMP_TYPE, Data::CUDNN_DATA_FLOAT)?;
        // SAFETY: REDUCTION_OPERATOR attributes are cudnnReduceTensorOp_t.
        unsafe {
            red.set(
                Attr::CUDNN_ATTR_REDUCTION_OPERATOR,
                Type::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
                &[operator],
            )?
        };
        let red = red.finalize()?;
        let ports = [
            (Attr::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x),
            (Attr::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y),
        ];
        let settings = [(Attr::CUDNN_ATTR_OPERATION_REDUCTION_DESC, &red)];
        self.operation(
            Kind::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
            &ports,
            &settings,
        )
    }

    /// `y`, a view of `x` with other dimensions and strides.
    pub fn reshape(&mut self, x: &Node, y: &Node) -> CudnnResult<()> {
        let ports = [
            (Attr::CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x),
            (Attr::CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y),
        ];
        self.operation(
            Kind::CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
            &ports,
            &[],
        )
    }

    /// `y`, a Bernoulli mask (1 with probability `keep`, else 0) from cuDNN's Philox generator
    /// keyed by the `seed` and `offset` tensors (the frontend's `rng` node).
    pub fn bernoulli(
        &mut self,
        keep: f64,
        seed: &Node,
        offset: &Node,
        y: &Node,
    ) -> CudnnResult<()> {
        let mut rng = Descriptor::new(Kind::CUDNN_BACKEND_RNG_DESCRIPTOR)?;
        // SAFETY: RNG_DISTRIBUTION attributes are cudnnRngDistribution_t, the Bernoulli
        // probability a DOUBLE.
        unsafe {
            rng.set(
                Attr::CUDNN_ATTR_RNG_DISTRIBUTION,
                Type::CUDNN_TYPE_RNG_DISTRIBUTION,
                &[sys::cudnnRngDistribution_t::CUDNN_RNG_DISTRIBUTION_BERNOULLI],
            )?;
            rng.set(
                Attr::CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY,
                Type::CUDNN_TYPE_DOUBLE,
                &[keep],
            )?;
        }
        let rng = rng.finalize()?;
        let ports = [
            (Attr::CUDNN_ATTR_OPERATION_RNG_YDESC, y),
            (Attr::CUDNN_ATTR_OPERATION_RNG_SEED, seed),
            (Attr::CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC, offset),
        ];
        let settings = [(Attr::CUDNN_ATTR_OPERATION_RNG_DESC, &rng)];
        self.operation(
            Kind::CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR,
            &ports,
            &settings,
        )
    }

    /// The operations, in the order they were added.
    pub fn ops(&self) -> Vec<&Descriptor> {
        self.ops.iter().collect()
    }
}
