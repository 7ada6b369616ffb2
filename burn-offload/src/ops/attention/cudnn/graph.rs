//! An operation graph of cuDNN's backend API, built op by op (tensors,
//! pointwise ops, matmuls, reductions, reshapes) and finalised into an
//! execution plan by cuDNN's heuristics: the vocabulary `sdpa.rs` writes
//! attention in.

use std::ffi::c_void;

use cudarc::cudnn::sys::{
    self, cudnnBackendAttributeName_t as Name, cudnnBackendDescriptorType_t as Kind,
    cudnnDataType_t as DataType, cudnnPointwiseMode_t as Mode,
};

use super::backend::{check, CudnnError, Descriptor, Result};

/// Engine configurations tried per heuristics mode before giving up.
const ENGINES_TRIED: usize = 8;

/// A tensor of the graph (its descriptor's place in the graph), with the
/// dims and strides it was declared with.
#[derive(Debug, Clone, Copy)]
pub(super) struct Node {
    index: usize,
    pub dims: [i64; 4],
    pub strides: [i64; 4],
}

/// Row-major strides of `dims`.
pub(super) fn packed(dims: [i64; 4]) -> [i64; 4] {
    [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1]
}

/// The graph under construction: its tensors and operations, kept alive
/// with the plan they finalise into.
#[derive(Debug)]
pub(super) struct Graph {
    tensors: Vec<Descriptor>,
    /// The pointwise, matmul and reduction descriptors the operations name.
    parts: Vec<Descriptor>,
    ops: Vec<Descriptor>,
    /// Ids past the caller's: virtual tensors and scalars of the graph.
    next_uid: i64,
}

impl Graph {
    /// A graph whose own tensors take ids from `first_uid` up (the caller's
    /// bound tensors use ids below it).
    pub(super) fn new(first_uid: i64) -> Self {
        Self {
            tensors: Vec::new(),
            parts: Vec::new(),
            ops: Vec::new(),
            next_uid: first_uid,
        }
    }

    fn tensor(
        &mut self,
        uid: i64,
        dims: [i64; 4],
        strides: [i64; 4],
        dtype: DataType,
        is_virtual: bool,
        by_value: bool,
    ) -> Result<Node> {
        use Name::*;
        let mut d = Descriptor::new(Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor")?
            .data_type(CUDNN_ATTR_TENSOR_DATA_TYPE, dtype)?
            .int64s(CUDNN_ATTR_TENSOR_DIMENSIONS, &dims)?
            .int64s(CUDNN_ATTR_TENSOR_STRIDES, &strides)?
            .int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid)?
            .int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16)?
            .boolean(CUDNN_ATTR_TENSOR_IS_VIRTUAL, is_virtual)?;
        if by_value {
            d = d.boolean(CUDNN_ATTR_TENSOR_IS_BY_VALUE, true)?;
        }
        self.tensors.push(d.finalize()?);
        Ok(Node {
            index: self.tensors.len() - 1,
            dims,
            strides,
        })
    }

    /// A tensor in device memory the caller binds to `uid` at execution.
    pub(super) fn bound(
        &mut self,
        uid: i64,
        dims: [i64; 4],
        strides: [i64; 4],
        dtype: DataType,
    ) -> Result<Node> {
        self.tensor(uid, dims, strides, dtype, false, false)
    }

    /// A scalar passed by value (a host pointer bound to `uid`).
    pub(super) fn scalar(&mut self, uid: i64, dtype: DataType) -> Result<Node> {
        self.tensor(uid, [1; 4], [1; 4], dtype, false, true)
    }

    /// A tensor that lives only inside the fused kernels.
    pub(super) fn inner(
        &mut self,
        dims: [i64; 4],
        strides: [i64; 4],
        dtype: DataType,
    ) -> Result<Node> {
        let uid = self.next_uid;
        self.next_uid += 1;
        self.tensor(uid, dims, strides, dtype, true, false)
    }

    /// An inner tensor shaped as `like`.
    pub(super) fn inner_like(&mut self, like: Node, dtype: DataType) -> Result<Node> {
        self.inner(like.dims, like.strides, dtype)
    }

    fn t(&self, n: Node) -> &Descriptor {
        &self.tensors[n.index]
    }

    /// `y = mode(x[, b[, t]])`, computed in `precision`; `axis` for
    /// `GEN_INDEX`.
    pub(super) fn pointwise(
        &mut self,
        mode: Mode,
        inputs: &[Node],
        y: Node,
        precision: DataType,
        axis: Option<i64>,
    ) -> Result<()> {
        use Name::*;
        let mut p = Descriptor::new(Kind::CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise")?
            .pointwise_mode(CUDNN_ATTR_POINTWISE_MODE, mode)?
            .data_type(CUDNN_ATTR_POINTWISE_MATH_PREC, precision)?;
        if let Some(axis) = axis {
            p = p.int64(CUDNN_ATTR_POINTWISE_AXIS, axis)?;
        }
        let p = p.finalize()?;
        let mut op = Descriptor::new(
            Kind::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
            "pointwise op",
        )?
        .descriptor(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &p)?;
        let slots = [
            CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
            CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
            CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
        ];
        for (slot, &x) in slots.into_iter().zip(inputs) {
            op = op.descriptor(slot, self.t(x))?;
        }
        let op = op
            .descriptor(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, self.t(y))?
            .finalize()?;
        self.parts.push(p);
        self.ops.push(op);
        Ok(())
    }

    /// A pointwise op whose output is a new inner tensor shaped as `like`,
    /// of `dtype`, computed in f32.
    pub(super) fn map(
        &mut self,
        mode: Mode,
        inputs: &[Node],
        like: Node,
        dtype: DataType,
    ) -> Result<Node> {
        let y = self.inner_like(like, dtype)?;
        self.pointwise(mode, inputs, y, DataType::CUDNN_DATA_FLOAT, None)?;
        Ok(y)
    }

    /// `c = a · b` over the last two dimensions, accumulated in f32 (the
    /// batch dimensions broadcast, so a key/value head serves its group).
    pub(super) fn matmul(&mut self, a: Node, b: Node, c: Node) -> Result<()> {
        use Name::*;
        let m = Descriptor::new(Kind::CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul")?
            .data_type(CUDNN_ATTR_MATMUL_COMP_TYPE, DataType::CUDNN_DATA_FLOAT)?
            .finalize()?;
        let op = Descriptor::new(Kind::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul op")?
            .descriptor(CUDNN_ATTR_OPERATION_MATMUL_ADESC, self.t(a))?
            .descriptor(CUDNN_ATTR_OPERATION_MATMUL_BDESC, self.t(b))?
            .descriptor(CUDNN_ATTR_OPERATION_MATMUL_CDESC, self.t(c))?
            .descriptor(CUDNN_ATTR_OPERATION_MATMUL_DESC, &m)?
            .finalize()?;
        self.parts.push(m);
        self.ops.push(op);
        Ok(())
    }

    /// `y = reduce(x)` over the dimensions where `y` has extent 1, in f32.
    pub(super) fn reduce(
        &mut self,
        op: sys::cudnnReduceTensorOp_t,
        x: Node,
        y: Node,
    ) -> Result<()> {
        use Name::*;
        let r = Descriptor::new(Kind::CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction")?
            .reduction(CUDNN_ATTR_REDUCTION_OPERATOR, op)?
            .data_type(CUDNN_ATTR_REDUCTION_COMP_TYPE, DataType::CUDNN_DATA_FLOAT)?
            .finalize()?;
        let o = Descriptor::new(
            Kind::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
            "reduction op",
        )?
        .descriptor(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, self.t(x))?
        .descriptor(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, self.t(y))?
        .descriptor(CUDNN_ATTR_OPERATION_REDUCTION_DESC, &r)?
        .finalize()?;
        self.parts.push(r);
        self.ops.push(o);
        Ok(())
    }

    /// `y`, the same values as `x` under other dims and strides (a
    /// transpose of an inner tensor).
    pub(super) fn reshape(&mut self, x: Node, y: Node) -> Result<()> {
        use Name::*;
        let op = Descriptor::new(
            Kind::CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
            "reshape op",
        )?
        .descriptor(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, self.t(x))?
        .descriptor(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, self.t(y))?
        .finalize()?;
        self.ops.push(op);
        Ok(())
    }

    /// The graph as an execution plan for `handle`: the first engine
    /// configuration cuDNN's heuristics offer that finalises (mode A, then
    /// the fallback list).
    pub(super) fn plan(self, handle: sys::cudnnHandle_t) -> Result<Plan> {
        use Name::*;
        let operations: Vec<&Descriptor> = self.ops.iter().collect();
        let graph = Descriptor::new(
            Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR,
            "operation graph",
        )?
        .handle(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle)?
        .descriptors(CUDNN_ATTR_OPERATIONGRAPH_OPS, &operations)?
        .finalize()?;
        let mut tried = 0;
        let mut last_error = None;
        for mode in [
            sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A,
            sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_FALLBACK,
        ] {
            let heuristics =
                Descriptor::new(Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics")?
                    .descriptor(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &graph)?
                    .heuristics_mode(CUDNN_ATTR_ENGINEHEUR_MODE, mode)?
                    .finalize();
            let Ok(heuristics) = heuristics else { continue };
            let configs = heuristics.get_descriptors(
                CUDNN_ATTR_ENGINEHEUR_RESULTS,
                Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
                ENGINES_TRIED,
            )?;
            for config in configs {
                tried += 1;
                let plan = Descriptor::new(
                    Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
                    "execution plan",
                )
                .and_then(|p| p.handle(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle))
                .and_then(|p| p.descriptor(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &config))
                .and_then(Descriptor::finalize);
                match plan {
                    Ok(plan) => {
                        let workspace = plan.get_int64(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?;
                        return Ok(Plan {
                            plan,
                            workspace: usize::try_from(workspace).unwrap_or(0),
                            _graph: (self, graph),
                        });
                    }
                    Err(e) => last_error = Some(e),
                }
            }
        }
        Err(last_error
            .filter(|_| tried == 0)
            .unwrap_or(CudnnError::NoEngine { tried }))
    }
}

/// A finalised plan and what it was built from.
#[derive(Debug)]
pub(super) struct Plan {
    plan: Descriptor,
    /// Bytes of device memory the plan's engine needs besides the tensors.
    pub workspace: usize,
    _graph: (Graph, Descriptor),
}

impl Plan {
    /// Queues the plan on `handle`'s stream with each `uids[i]` at
    /// `pointers[i]` (a device address, or a host address for a scalar).
    ///
    /// # Safety
    /// The pointers address live memory of the layouts the graph describes,
    /// `workspace` at least [`Plan::workspace`] bytes, until the stream has
    /// run the plan.
    pub(super) unsafe fn execute(
        &self,
        handle: sys::cudnnHandle_t,
        uids: &[i64],
        pointers: &[*mut c_void],
        workspace: *mut c_void,
    ) -> Result<()> {
        use Name::*;
        let pack = Descriptor::new(Kind::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack")?
            .int64s(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids)?
            .void_ptrs(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, pointers)?
            .void_ptrs(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, &[workspace])?
            .finalize()?;
        // SAFETY: as the caller promises.
        check(
            unsafe { sys::cudnnBackendExecute(handle, self.plan.raw(), pack.raw()) },
            "execute",
        )
    }
}
