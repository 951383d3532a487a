//! An owned layer over cuDNN's graph ("backend") API, as much of it as weft's fused passes use:
//! descriptors created, given attributes, finalized and destroyed once ([`Descriptor`]);
//! tensors by unique id; an operation graph's engine configurations from cuDNN's heuristics;
//! an execution plan with its workspace; and one execution of a plan on a variant pack of
//! device pointers. The legacy API (`cudnn_plan`) has no fused passes; this one describes a
//! pass as a graph of operations and lets cuDNN pick (or compile) a kernel for the whole graph.

use std::ffi::c_void;
use std::ptr::null_mut;

use cudarc::cudnn::result::{CudnnError, CudnnResult};
use cudarc::cudnn::sys;

use sys::cudnnBackendAttributeName_t as Attr;
use sys::cudnnBackendAttributeType_t as Type;
use sys::cudnnBackendDescriptorType_t as Kind;

/// One backend descriptor, destroyed when dropped.
pub(crate) struct Descriptor(sys::cudnnBackendDescriptor_t);

impl Drop for Descriptor {
    fn drop(&mut self) {
        // SAFETY: created by `Descriptor::new` and destroyed once, here.
        let _ = unsafe { sys::cudnnBackendDestroyDescriptor(self.0) };
    }
}

impl Descriptor {
    pub fn new(kind: Kind) -> CudnnResult<Self> {
        let mut raw = null_mut();
        // SAFETY: cuDNN writes the new descriptor into `raw`.
        unsafe { sys::cudnnBackendCreateDescriptor(kind, &mut raw) }.result()?;
        Ok(Self(raw))
    }

    /// Sets attribute `name` to `values`, elements of cuDNN's type `ty`.
    ///
    /// # Safety
    /// `T` must be the C type of `ty` (i64 for INT64, f32 for FLOAT, a descriptor for
    /// BACKEND_DESCRIPTOR, a pointer for VOID_PTR, the enum itself for enums).
    pub unsafe fn set<T>(&mut self, name: Attr, ty: Type, values: &[T]) -> CudnnResult<()> {
        sys::cudnnBackendSetAttribute(
            self.0,
            name,
            ty,
            values.len() as i64,
            values.as_ptr().cast(),
        )
        .result()
    }

    pub fn set_i64s(&mut self, name: Attr, values: &[i64]) -> CudnnResult<()> {
        // SAFETY: INT64 attributes are arrays of i64.
        unsafe { self.set(name, Type::CUDNN_TYPE_INT64, values) }
    }

    pub fn set_data_type(&mut self, name: Attr, dtype: sys::cudnnDataType_t) -> CudnnResult<()> {
        // SAFETY: DATA_TYPE attributes are cudnnDataType_t.
        unsafe { self.set(name, Type::CUDNN_TYPE_DATA_TYPE, &[dtype]) }
    }

    pub fn set_descriptors(&mut self, name: Attr, values: &[&Descriptor]) -> CudnnResult<()> {
        let raw: Vec<_> = values.iter().map(|d| d.0).collect();
        // SAFETY: BACKEND_DESCRIPTOR attributes are arrays of descriptors, alive while set.
        unsafe { self.set(name, Type::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw) }
    }

    pub fn set_handle(&mut self, name: Attr, handle: sys::cudnnHandle_t) -> CudnnResult<()> {
        // SAFETY: HANDLE attributes are cudnnHandle_t.
        unsafe { self.set(name, Type::CUDNN_TYPE_HANDLE, &[handle]) }
    }

    pub fn finalize(self) -> CudnnResult<Self> {
        // SAFETY: a descriptor of ours, with its attributes set.
        unsafe { sys::cudnnBackendFinalize(self.0) }.result()?;
        Ok(self)
    }

    /// Reads attribute `name`, elements of cuDNN's type `ty`, into `values`; returns how many
    /// cuDNN wrote (at most `values.len()`).
    ///
    /// # Safety
    /// `T` must be the C type of `ty`, as for [`Descriptor::set`].
    pub unsafe fn get<T>(&self, name: Attr, ty: Type, values: &mut [T]) -> CudnnResult<usize> {
        let mut count = 0i64;
        sys::cudnnBackendGetAttribute(
            self.0,
            name,
            ty,
            values.len() as i64,
            &mut count,
            values.as_mut_ptr().cast(),
        )
        .result()?;
        Ok(count.clamp(0, values.len() as i64) as usize)
    }

    /// The INT64 attribute `name` of a finalized descriptor.
    pub fn get_i64(&self, name: Attr) -> CudnnResult<i64> {
        let mut value = [0i64];
        // SAFETY: INT64 attributes are arrays of i64.
        unsafe { self.get(name, Type::CUDNN_TYPE_INT64, &mut value) }?;
        Ok(value[0])
    }

    /// Fills the created descriptors `into` from the BACKEND_DESCRIPTOR attribute `name`;
    /// returns how many cuDNN filled (the first ones).
    pub fn get_descriptors(&self, name: Attr, into: &[Descriptor]) -> CudnnResult<usize> {
        let mut raw: Vec<_> = into.iter().map(|d| d.0).collect();
        // SAFETY: BACKEND_DESCRIPTOR attributes are arrays of descriptors; cuDNN fills the
        // created descriptors `raw` points to, all alive in `into`.
        unsafe { self.get(name, Type::CUDNN_TYPE_BACKEND_DESCRIPTOR, &mut raw) }
    }
}

/// A tensor of the graph: its unique id, `dtype`, NCHW-ordered `dims` with `strides`, and
/// whether it is virtual (never in memory: an intermediate the fused kernel keeps inside).
pub(crate) fn tensor(
    uid: i64,
    dtype: sys::cudnnDataType_t,
    dims: &[i64],
    strides: &[i64],
    is_virtual: bool,
) -> CudnnResult<Descriptor> {
    tensor_with(uid, dtype, (dims, strides), is_virtual, false)
}

/// [`tensor`], or a scalar passed by value at execution (`by_value`: a host pointer in the
/// variant pack).
pub(crate) fn tensor_with(
    uid: i64,
    dtype: sys::cudnnDataType_t,
    (dims, strides): (&[i64], &[i64]),
    is_virtual: bool,
    by_value: bool,
) -> CudnnResult<Descriptor> {
    let mut d = Descriptor::new(Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    d.set_data_type(Attr::CUDNN_ATTR_TENSOR_DATA_TYPE, dtype)?;
    d.set_i64s(Attr::CUDNN_ATTR_TENSOR_DIMENSIONS, dims)?;
    d.set_i64s(Attr::CUDNN_ATTR_TENSOR_STRIDES, strides)?;
    d.set_i64s(Attr::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[uid])?;
    d.set_i64s(Attr::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[16])?;
    // SAFETY: IS_VIRTUAL and IS_BY_VALUE are BOOLEANs (C bool).
    unsafe {
        d.set(
            Attr::CUDNN_ATTR_TENSOR_IS_VIRTUAL,
            Type::CUDNN_TYPE_BOOLEAN,
            &[is_virtual],
        )?;
        if by_value {
            d.set(
                Attr::CUDNN_ATTR_TENSOR_IS_BY_VALUE,
                Type::CUDNN_TYPE_BOOLEAN,
                &[true],
            )?;
        }
    }
    d.finalize()
}

/// The finalized operation graph of `ops` on `handle` and the engine configurations cuDNN's
/// heuristics (mode A) offer for it, best first.
fn heuristic_configs(
    handle: sys::cudnnHandle_t,
    ops: &[&Descriptor],
) -> CudnnResult<(Descriptor, Vec<Descriptor>)> {
    let mut graph = Descriptor::new(Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    graph.set_descriptors(Attr::CUDNN_ATTR_OPERATIONGRAPH_OPS, ops)?;
    graph.set_handle(Attr::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle)?;
    let graph = graph.finalize()?;
    let mut heuristics = Descriptor::new(Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heuristics.set_descriptors(Attr::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[&graph])?;
    // SAFETY: HEUR_MODE attributes are cudnnBackendHeurMode_t.
    unsafe {
        heuristics.set(
            Attr::CUDNN_ATTR_ENGINEHEUR_MODE,
            Type::CUDNN_TYPE_HEUR_MODE,
            &[sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A],
        )?
    };
    let heuristics = heuristics.finalize()?;
    const WANTED: usize = 16;
    let configs = (0..WANTED)
        .map(|_| Descriptor::new(Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
        .collect::<CudnnResult<Vec<_>>>()?;
    let count = heuristics.get_descriptors(Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS, &configs)?;
    Ok((graph, configs.into_iter().take(count).collect()))
}

/// The execution plan of `config` on `handle`.
fn plan_of(handle: sys::cudnnHandle_t, config: &Descriptor) -> CudnnResult<Descriptor> {
    let mut plan = Descriptor::new(Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
    plan.set_handle(Attr::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle)?;
    plan.set_descriptors(Attr::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[config])?;
    plan.finalize()
}

/// The plan of the first of cuDNN's heuristic choices for `ops` that finalizes (the
/// frontend's default policy), runtime-compiled engines included, and its workspace in bytes;
/// cuDNN's last error when none does.
pub(crate) fn first_plan(
    handle: sys::cudnnHandle_t,
    ops: &[&Descriptor],
) -> CudnnResult<(Descriptor, usize)> {
    let (_graph, configs) = heuristic_configs(handle, ops)?;
    let mut last = CudnnError(sys::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED);
    for config in &configs {
        match plan_of(handle, config) {
            Ok(plan) => {
                let workspace = plan.get_i64(Attr::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?;
                return Ok((plan, workspace.max(0) as usize));
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Execution plans for the operations `ops` on `handle`: from the engine configurations of
/// cuDNN's heuristics (mode A) in their order, then every engine of the graph in its default
/// configuration, leaving out configurations that do not finalize and, unless
/// `runtime_compiled`, engines cuDNN compiles at run time (NVRTC: about half a second a plan).
/// Also returns how many were left out as compiled at run time (the plans may then be none).
/// cuDNN's last error when no configuration finalizes.
pub(crate) fn plans(
    handle: sys::cudnnHandle_t,
    ops: &[&Descriptor],
    runtime_compiled: bool,
) -> CudnnResult<(Vec<Descriptor>, usize)> {
    let (graph, mut configs) = heuristic_configs(handle, ops)?;
    configs.extend(every_engine(&graph)?);
    let mut last = CudnnError(sys::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED);
    let mut plans = Vec::new();
    let mut compiled_at_run_time = 0;
    for config in &configs {
        if !runtime_compiled && compiles_at_run_time(config)? {
            compiled_at_run_time += 1;
            continue;
        }
        match plan_of(handle, config) {
            Ok(plan) => plans.push(plan),
            Err(e) => last = e,
        }
    }
    match plans.is_empty() && compiled_at_run_time == 0 {
        true => Err(last),
        false => Ok((plans, compiled_at_run_time)),
    }
}

/// Whether the engine of the finalized engine configuration `config` carries cuDNN's
/// runtime-compilation behaviour note.
fn compiles_at_run_time(config: &Descriptor) -> CudnnResult<bool> {
    let engine = [Descriptor::new(Kind::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?];
    config.get_descriptors(Attr::CUDNN_ATTR_ENGINECFG_ENGINE, &engine)?;
    let mut notes = [sys::cudnnBackendBehaviorNote_t::CUDNN_BEHAVIOR_NOTE_TYPE_COUNT; 16];
    // SAFETY: BEHAVIOR_NOTE attributes are arrays of cudnnBackendBehaviorNote_t.
    let count = unsafe {
        engine[0].get(
            Attr::CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE,
            Type::CUDNN_TYPE_BEHAVIOR_NOTE,
            &mut notes,
        )
    }?;
    Ok(notes[..count]
        .contains(&sys::cudnnBackendBehaviorNote_t::CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION))
}

/// The default configuration of each engine that supports `graph`, by global index.
fn every_engine(graph: &Descriptor) -> CudnnResult<Vec<Descriptor>> {
    let count = graph.get_i64(Attr::CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT)?;
    let mut configs = Vec::new();
    for index in 0..count {
        let config = (|| {
            let mut engine = Descriptor::new(Kind::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
            engine.set_descriptors(Attr::CUDNN_ATTR_ENGINE_OPERATION_GRAPH, &[graph])?;
            engine.set_i64s(Attr::CUDNN_ATTR_ENGINE_GLOBAL_INDEX, &[index])?;
            let engine = engine.finalize()?;
            let mut config = Descriptor::new(Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)?;
            config.set_descriptors(Attr::CUDNN_ATTR_ENGINECFG_ENGINE, &[&engine])?;
            config.finalize()
        })();
        configs.extend(config.ok());
    }
    Ok(configs)
}

/// Runs `plan` on `handle`'s stream with the device pointers `pointers` of the tensors `uids`
/// and `workspace` (the plan's workspace size, at least).
///
/// # Safety
/// Every pointer must address a live device buffer of the size and layout its tensor's
/// descriptor gives, and `workspace` as many bytes as the plan asks.
pub(crate) unsafe fn execute(
    handle: sys::cudnnHandle_t,
    plan: &Descriptor,
    uids: &[i64],
    pointers: &[*mut c_void],
    workspace: *mut c_void,
) -> CudnnResult<()> {
    let mut pack = Descriptor::new(Kind::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
    pack.set_i64s(Attr::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids)?;
    pack.set(
        Attr::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
        Type::CUDNN_TYPE_VOID_PTR,
        pointers,
    )?;
    pack.set(
        Attr::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
        Type::CUDNN_TYPE_VOID_PTR,
        &[workspace],
    )?;
    let pack = pack.finalize()?;
    sys::cudnnBackendExecute(handle, plan.0, pack.0).result()
}
