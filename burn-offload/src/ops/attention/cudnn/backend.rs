//! cuDNN's backend API (cudarc's `cudnn::sys`, loaded at run time) as owned
//! descriptors whose attributes are set by type: what the graph and the
//! launcher build on.

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;

use cudarc::cudnn::sys::{
    self, cudnnBackendAttributeName_t as Name, cudnnBackendAttributeType_t as Type,
    cudnnBackendDescriptorType_t as Kind, cudnnDataType_t, cudnnStatus_t,
};

/// Why cuDNN did not run a call; the launcher falls back to the CubeCL
/// kernels and says this once.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CudnnError {
    /// No `libcudnn.so.9` (or `libcudnn.so`) on the library path.
    #[error("libcudnn.so.9 is not on the library path")]
    Missing,
    /// A library older than the fused attention this graph asks for.
    #[error("cuDNN {found} is older than 9.0, whose fused attention this needs")]
    TooOld {
        /// `cudnnGetVersion()`, e.g. 91900 for 9.19.0.
        found: usize,
    },
    /// A backend call failed.
    #[error("{call}: {status}")]
    Status {
        /// The descriptor or call that failed.
        call: &'static str,
        /// cuDNN's own text for the status.
        status: String,
    },
    /// Heuristics offered no engine that finalises for the graph.
    #[error("no cuDNN engine runs this graph ({tried} tried)")]
    NoEngine {
        /// Engine configurations tried.
        tried: usize,
    },
    /// A shape whose plan failed to build before (said then).
    #[error("cuDNN refused this shape before")]
    Refused,
    /// The tensors are not what the graph describes (alignment, stream).
    #[error("{0}")]
    Layout(&'static str),
}

pub(crate) type Result<T> = std::result::Result<T, CudnnError>;

pub(super) fn check(status: cudnnStatus_t, call: &'static str) -> Result<()> {
    if status == cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        return Ok(());
    }
    // SAFETY: cuDNN returns a static, NUL-terminated string for any status.
    let text = unsafe { CStr::from_ptr(sys::cudnnGetErrorString(status)) };
    Err(CudnnError::Status {
        call,
        status: text.to_string_lossy().into_owned(),
    })
}

/// One backend descriptor, destroyed when dropped.
#[derive(Debug)]
pub(super) struct Descriptor {
    raw: sys::cudnnBackendDescriptor_t,
    /// Named in errors.
    what: &'static str,
}

impl Descriptor {
    pub(super) fn new(kind: Kind, what: &'static str) -> Result<Self> {
        let mut raw = null_mut();
        // SAFETY: `raw` receives a new descriptor owned by the result.
        check(
            unsafe { sys::cudnnBackendCreateDescriptor(kind, &mut raw) },
            what,
        )?;
        Ok(Self { raw, what })
    }

    pub(super) fn raw(&self) -> sys::cudnnBackendDescriptor_t {
        self.raw
    }

    /// # Safety
    /// `values` holds `count` values of the C type `kind` names.
    unsafe fn set(
        self,
        name: Name,
        kind: Type,
        count: usize,
        values: *const c_void,
    ) -> Result<Self> {
        // SAFETY: as the caller promises; `self.raw` is live.
        let status =
            unsafe { sys::cudnnBackendSetAttribute(self.raw, name, kind, count as i64, values) };
        check(status, self.what)?;
        Ok(self)
    }

    pub(super) fn int64s(self, name: Name, values: &[i64]) -> Result<Self> {
        // SAFETY: `values` is a slice of int64.
        unsafe {
            self.set(
                name,
                Type::CUDNN_TYPE_INT64,
                values.len(),
                values.as_ptr().cast(),
            )
        }
    }

    pub(super) fn int64(self, name: Name, value: i64) -> Result<Self> {
        self.int64s(name, &[value])
    }

    pub(super) fn boolean(self, name: Name, value: bool) -> Result<Self> {
        // SAFETY: CUDNN_TYPE_BOOLEAN is C++'s `bool`, one byte like Rust's.
        unsafe {
            self.set(
                name,
                Type::CUDNN_TYPE_BOOLEAN,
                1,
                (&value as *const bool).cast(),
            )
        }
    }

    pub(super) fn data_type(self, name: Name, value: cudnnDataType_t) -> Result<Self> {
        // SAFETY: a `repr(u32)` enum, as cuDNN's.
        unsafe {
            self.set(
                name,
                Type::CUDNN_TYPE_DATA_TYPE,
                1,
                (&value as *const cudnnDataType_t).cast(),
            )
        }
    }

    pub(super) fn pointwise_mode(
        self,
        name: Name,
        value: sys::cudnnPointwiseMode_t,
    ) -> Result<Self> {
        // SAFETY: as for `data_type`.
        unsafe {
            self.set(
                name,
                Type::CUDNN_TYPE_POINTWISE_MODE,
                1,
                (&value as *const sys::cudnnPointwiseMode_t).cast(),
            )
        }
    }

    pub(super) fn reduction(self, name: Name, value: sys::cudnnReduceTensorOp_t) -> Result<Self> {
        // SAFETY: as for `data_type`.
        unsafe {
            self.set(
                name,
                Type::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
                1,
                (&value as *const sys::cudnnReduceTensorOp_t).cast(),
            )
        }
    }

    pub(super) fn heuristics_mode(
        self,
        name: Name,
        value: sys::cudnnBackendHeurMode_t,
    ) -> Result<Self> {
        // SAFETY: as for `data_type`.
        unsafe {
            self.set(
                name,
                Type::CUDNN_TYPE_HEUR_MODE,
                1,
                (&value as *const sys::cudnnBackendHeurMode_t).cast(),
            )
        }
    }

    pub(super) fn handle(self, name: Name, handle: sys::cudnnHandle_t) -> Result<Self> {
        // SAFETY: one handle.
        unsafe {
            self.set(
                name,
                Type::CUDNN_TYPE_HANDLE,
                1,
                (&handle as *const sys::cudnnHandle_t).cast(),
            )
        }
    }

    pub(super) fn descriptor(self, name: Name, other: &Descriptor) -> Result<Self> {
        self.descriptors(name, &[other])
    }

    pub(super) fn descriptors(self, name: Name, others: &[&Descriptor]) -> Result<Self> {
        let raws: Vec<_> = others.iter().map(|d| d.raw).collect();
        // SAFETY: an array of live descriptors.
        unsafe {
            self.set(
                name,
                Type::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                raws.len(),
                raws.as_ptr().cast(),
            )
        }
    }

    pub(super) fn void_ptrs(self, name: Name, pointers: &[*mut c_void]) -> Result<Self> {
        // SAFETY: an array of pointers.
        unsafe {
            self.set(
                name,
                Type::CUDNN_TYPE_VOID_PTR,
                pointers.len(),
                pointers.as_ptr().cast(),
            )
        }
    }

    pub(super) fn finalize(self) -> Result<Self> {
        // SAFETY: a live descriptor.
        check(unsafe { sys::cudnnBackendFinalize(self.raw) }, self.what)?;
        Ok(self)
    }

    pub(super) fn get_int64(&self, name: Name) -> Result<i64> {
        let (mut value, mut count) = (0i64, 0i64);
        // SAFETY: room for one int64.
        let status = unsafe {
            sys::cudnnBackendGetAttribute(
                self.raw,
                name,
                Type::CUDNN_TYPE_INT64,
                1,
                &mut count,
                (&mut value as *mut i64).cast(),
            )
        };
        check(status, self.what)?;
        Ok(value)
    }

    /// The descriptors of kind `kind` that attribute `name` holds (engine
    /// configurations from heuristics), at most `limit`.
    pub(super) fn get_descriptors(
        &self,
        name: Name,
        kind: Kind,
        limit: usize,
    ) -> Result<Vec<Descriptor>> {
        let mut count = 0i64;
        // SAFETY: a count query writes only `count`.
        let status = unsafe {
            sys::cudnnBackendGetAttribute(
                self.raw,
                name,
                Type::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                0,
                &mut count,
                null_mut(),
            )
        };
        check(status, self.what)?;
        let wanted = usize::try_from(count).unwrap_or(0).min(limit);
        let found = (0..wanted)
            .map(|_| Descriptor::new(kind, "engine configuration"))
            .collect::<Result<Vec<_>>>()?;
        let mut raws: Vec<_> = found.iter().map(|d| d.raw).collect();
        let mut filled = 0i64;
        // SAFETY: `raws` holds `wanted` live descriptors for cuDNN to fill.
        let status = unsafe {
            sys::cudnnBackendGetAttribute(
                self.raw,
                name,
                Type::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                wanted as i64,
                &mut filled,
                raws.as_mut_ptr().cast(),
            )
        };
        check(status, self.what)?;
        let mut found = found;
        found.truncate(usize::try_from(filled).unwrap_or(0).min(wanted));
        Ok(found)
    }
}

impl Drop for Descriptor {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once; a failure leaks it.
        unsafe {
            sys::cudnnBackendDestroyDescriptor(self.raw);
        }
    }
}
