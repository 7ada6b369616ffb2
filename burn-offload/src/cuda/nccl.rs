//! NCCL's functions, opened by the names NCCL is installed under.
//!
//! cudarc 0.19's loader tries `libnccl.so` and `libnccl.so.<CUDA major>`
//! (`.12`, `.11`, …, `.1`) but never `libnccl.so.2`, the only name that
//! NCCL's runtime packages install (`libnccl2`, pip's `nvidia-nccl-cu12`);
//! `libnccl.so` comes only with the development package. Loading
//! `libnccl.so.2` first does not help cudarc: a later `dlopen("libnccl.so")`
//! matches no loaded library (the soname is `libnccl.so.2`). So the few
//! functions the collectives call are resolved here, from
//! [`LIBRARY_NAMES`] in order, with cudarc's types.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use cudarc::nccl::sys::{
    cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclUniqueId,
};
use libloading::Library;

/// The names tried, in order, each as `dlopen` searches it
/// (`LD_LIBRARY_PATH`, the loader's cache, the system folders): the
/// runtime's versioned name, then the development link.
pub(crate) const LIBRARY_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// A call NCCL refused, with its result code.
#[derive(Debug, thiserror::Error)]
#[error("{0:?}")]
pub(crate) struct NcclError(pub ncclResult_t);

type GetUniqueId = unsafe extern "C" fn(*mut ncclUniqueId) -> ncclResult_t;
type CommInitRank =
    unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> ncclResult_t;
type CommInitAll = unsafe extern "C" fn(*mut ncclComm_t, c_int, *const c_int) -> ncclResult_t;
type Group = unsafe extern "C" fn() -> ncclResult_t;
type Reduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    c_int,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
type AllGather = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;

/// The library, open for the process's life, and its functions.
struct Nccl {
    _library: Library,
    get_unique_id: GetUniqueId,
    comm_init_rank: CommInitRank,
    comm_init_all: CommInitAll,
    group_start: Group,
    group_end: Group,
    reduce: Reduce,
    all_reduce: AllReduce,
    all_gather: AllGather,
}

impl Nccl {
    /// The first of `names` that opens and has every function.
    fn open(names: &[&str]) -> Option<Nccl> {
        names.iter().find_map(|name| {
            // SAFETY: NCCL's initialisers only set up its own state.
            let library = unsafe { Library::new(name) }.ok()?;
            // SAFETY: each symbol has NCCL's C signature (nccl.h), and the
            // pointers live as long as the library, which `Nccl` keeps.
            unsafe {
                Some(Nccl {
                    get_unique_id: *library.get(b"ncclGetUniqueId\0").ok()?,
                    comm_init_rank: *library.get(b"ncclCommInitRank\0").ok()?,
                    comm_init_all: *library.get(b"ncclCommInitAll\0").ok()?,
                    group_start: *library.get(b"ncclGroupStart\0").ok()?,
                    group_end: *library.get(b"ncclGroupEnd\0").ok()?,
                    reduce: *library.get(b"ncclReduce\0").ok()?,
                    all_reduce: *library.get(b"ncclAllReduce\0").ok()?,
                    all_gather: *library.get(b"ncclAllGather\0").ok()?,
                    _library: library,
                })
            }
        })
    }
}

static NCCL: OnceLock<Option<Nccl>> = OnceLock::new();

fn loaded() -> Option<&'static Nccl> {
    NCCL.get_or_init(|| Nccl::open(&LIBRARY_NAMES)).as_ref()
}

/// Whether NCCL loads (the collectives are called only when it does).
pub(crate) fn is_present() -> bool {
    loaded().is_some()
}

fn nccl() -> &'static Nccl {
    loaded().unwrap_or_else(|| {
        panic!("NCCL did not load (tried {LIBRARY_NAMES:?}); check is_present() first")
    })
}

/// NCCL's result as a `Result`: an operation still in progress (a
/// non-blocking communicator's) is not an error.
fn checked(result: ncclResult_t) -> Result<(), NcclError> {
    match result {
        ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress => Ok(()),
        error => Err(NcclError(error)),
    }
}

pub(crate) fn get_unique_id() -> Result<ncclUniqueId, NcclError> {
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: room for one id.
    checked(unsafe { (nccl().get_unique_id)(&mut id) })?;
    Ok(id)
}

/// # Safety
/// `comm` has room for one communicator.
pub(crate) unsafe fn comm_init_rank(
    comm: *mut ncclComm_t,
    ranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
) -> Result<(), NcclError> {
    checked((nccl().comm_init_rank)(comm, ranks, id, rank))
}

/// # Safety
/// `comms` has room for `devices` communicators, `list` holds `devices`.
pub(crate) unsafe fn comm_init_all(
    comms: *mut ncclComm_t,
    devices: c_int,
    list: *const c_int,
) -> Result<(), NcclError> {
    checked((nccl().comm_init_all)(comms, devices, list))
}

pub(crate) fn group_start() -> Result<(), NcclError> {
    // SAFETY: no arguments.
    checked(unsafe { (nccl().group_start)() })
}

pub(crate) fn group_end() -> Result<(), NcclError> {
    // SAFETY: no arguments.
    checked(unsafe { (nccl().group_end)() })
}

/// # Safety
/// As `ncclReduce`: live device buffers of `count` elements, a communicator
/// and a stream of the buffers' device.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn reduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<(), NcclError> {
    checked((nccl().reduce)(
        send, recv, count, dtype, op, root, comm, stream,
    ))
}

/// # Safety
/// As `ncclAllReduce`: see [`reduce`].
pub(crate) unsafe fn all_reduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<(), NcclError> {
    checked((nccl().all_reduce)(
        send, recv, count, dtype, op, comm, stream,
    ))
}

/// # Safety
/// As `ncclAllGather`: `recv` holds `count` elements of every rank.
pub(crate) unsafe fn all_gather(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<(), NcclError> {
    checked((nccl().all_gather)(send, recv, count, dtype, comm, stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtimes_name_comes_before_the_development_link() {
        assert_eq!(LIBRARY_NAMES, ["libnccl.so.2", "libnccl.so"]);
    }

    #[test]
    fn a_missing_library_is_absent_not_a_panic() {
        assert!(Nccl::open(&["libnccl-not-installed.so.2"]).is_none());
        // A library without NCCL's functions is no NCCL either.
        assert!(Nccl::open(&["libc.so.6"]).is_none());
    }
}
