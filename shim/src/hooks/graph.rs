//! CUDA-graph memory nodes: `cuGraphAddMemAllocNode` records the node's bytes on its pool's
//! device, and instantiating the graph charges them for as long as the executable graph lives
//! (`Runtime::instantiate`; refused before the driver is asked when they do not fit).
//!
//! Must never: fail an instantiation the driver granted, or credit an executable graph the driver
//! did not destroy.

use super::guard::{after, guarded, real_call, OnPanic, CUDA_ERROR_NOT_FOUND};
use crate::runtime;
use cudarc::driver::sys::{CUgraph, CUgraphExec, CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS};
use std::ffi::{c_char, c_void};

/// `CU_MEM_LOCATION_TYPE_DEVICE` (cuda.h).
const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;

/// Runs `f` on the enforcing runtime after a successful driver call.
fn on_success(rc: u32, f: impl FnOnce(&runtime::Runtime)) -> u32 {
    if rc == 0 {
        after(|| {
            if let Some(rt) = runtime::enforcing() {
                f(rt);
            }
        });
    }
    rc
}

/// Instantiates `graph` through `real`, charging its allocation nodes; `exec` receives it.
fn instantiate(graph: CUgraph, exec: *mut CUgraphExec, real: impl Fn() -> u32) -> u32 {
    guarded(OnPanic::Alloc, real, |call| match runtime::enforcing() {
        None => call(),
        Some(rt) => rt.instantiate(graph as u64, || {
            let rc = call();
            let e = if rc == 0 && !exec.is_null() {
                // SAFETY: the caller's out pointer, written by the driver on success.
                unsafe { exec.read() as u64 }
            } else {
                0
            };
            (rc, e)
        }),
    })
}

/// # Safety
/// cuda.h contract of `cuGraphAddMemAllocNode`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    params: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> u32 {
    let real = real_call!(cuGraphAddMemAllocNode: fn(*mut CUgraphNode, CUgraph, *const CUgraphNode, usize, *mut CUDA_MEM_ALLOC_NODE_PARAMS)(node, graph, deps, n, params), else CUDA_ERROR_NOT_FOUND);
    let rc = guarded(OnPanic::Real, real, |call| call());
    if rc != 0 || params.is_null() {
        return rc;
    }
    // SAFETY: the caller's node parameters; the location type is read as its u32 (never as a Rust
    // enum a foreign value could make invalid), the id and size as plain integers.
    let (ty, id, bytes) = unsafe {
        (
            std::ptr::addr_of!((*params).poolProps.location.type_)
                .cast::<u32>()
                .read(),
            std::ptr::addr_of!((*params).poolProps.location.id).read(),
            std::ptr::addr_of!((*params).bytesize).read() as u64,
        )
    };
    on_success(rc, |rt| {
        if ty == CU_MEM_LOCATION_TYPE_DEVICE && id >= 0 {
            rt.ledger.graph_alloc_node(graph as u64, id as usize, bytes);
        }
    })
}

/// # Safety
/// cuda.h contract of `cuGraphInstantiate` (CUDA < 12 prototype).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    err_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> u32 {
    let real = real_call!(cuGraphInstantiate: fn(*mut CUgraphExec, CUgraph, *mut CUgraphNode, *mut c_char, usize)(exec, graph, err_node, log, log_size), else CUDA_ERROR_NOT_FOUND);
    instantiate(graph, exec, real)
}

/// # Safety
/// cuda.h contract of `cuGraphInstantiate_v2`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    err_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> u32 {
    let real = real_call!(cuGraphInstantiate_v2: fn(*mut CUgraphExec, CUgraph, *mut CUgraphNode, *mut c_char, usize)(exec, graph, err_node, log, log_size), else CUDA_ERROR_NOT_FOUND);
    instantiate(graph, exec, real)
}

/// # Safety
/// cuda.h contract of `cuGraphInstantiateWithFlags`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: u64,
) -> u32 {
    let real = real_call!(cuGraphInstantiateWithFlags: fn(*mut CUgraphExec, CUgraph, u64)(exec, graph, flags), else CUDA_ERROR_NOT_FOUND);
    instantiate(graph, exec, real)
}

/// # Safety
/// cuda.h contract of `cuGraphInstantiateWithParams` (the parameters are passed through).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut c_void,
) -> u32 {
    let real = real_call!(cuGraphInstantiateWithParams: fn(*mut CUgraphExec, CUgraph, *mut c_void)(exec, graph, params), else CUDA_ERROR_NOT_FOUND);
    instantiate(graph, exec, real)
}

/// # Safety
/// cuda.h contract of `cuGraphExecDestroy`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> u32 {
    let real = real_call!(cuGraphExecDestroy: fn(CUgraphExec)(exec), else CUDA_ERROR_NOT_FOUND);
    let rc = guarded(OnPanic::Real, real, |call| call());
    on_success(rc, |rt| rt.graph_exec_destroyed(exec as u64))
}

/// # Safety
/// cuda.h contract of `cuGraphDestroy`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuGraphDestroy(graph: CUgraph) -> u32 {
    let real = real_call!(cuGraphDestroy: fn(CUgraph)(graph), else CUDA_ERROR_NOT_FOUND);
    let rc = guarded(OnPanic::Real, real, |call| call());
    on_success(rc, |rt| rt.ledger.graph_destroyed(graph as u64))
}
