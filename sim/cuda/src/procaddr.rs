//! `cuGetProcAddress(_v2)` resolution and error names, as the real driver does them.
//!
//! The real driver keeps, per base name, the ABI versions it has shipped; `cudaTypedefs.h` names
//! them `PFN_<name>_v<version>[_ptsz|_ptds]`. A request `(symbol, cudaVersion, flags)` gets the
//! newest variant whose version is ≤ `cudaVersion`; with `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`
//! it gets the `_ptsz` / `_ptds` export where one exists. A known name whose first variant is newer
//! than `cudaVersion` answers `CUDA_ERROR_NOT_FOUND` with status `VERSION_NOT_SUFFICIENT`; an
//! unknown name answers `CUDA_ERROR_NOT_FOUND` with status `SYMBOL_NOT_FOUND`. Base names only:
//! `"cuMemAlloc_v2"` is not a base name and is not found.

use crate::exports::*;
use crate::state::R;
use cudarc::driver::sys::cudaError_enum as E;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

/// One shipped variant of a driver entry point.
pub struct Entry {
    pub base: &'static str,
    /// First `cudaVersion` that gets this variant (e.g. 3020 for cuMemAlloc_v2).
    pub since: u32,
    pub export: &'static str,
    pub addr: usize,
    /// The per-thread-default-stream export of the same variant, if any.
    pub per_thread: Option<(&'static str, usize)>,
}

macro_rules! table {
    ($( $base:literal $since:literal $export:ident $(| $pt:ident)? ;)*) => {
        fn build() -> Vec<Entry> {
            vec![$(
                Entry {
                    base: $base,
                    since: $since,
                    export: stringify!($export),
                    addr: $export as *const () as usize,
                    per_thread: table!(@pt $($pt)?),
                },
            )*]
        }
    };
    (@pt $pt:ident) => { Some((stringify!($pt), $pt as *const () as usize)) };
    (@pt) => { None };
}

// Versions follow cudaTypedefs.h (CUDA 12.8): PFN_cuMemAlloc_v3020 is cuMemAlloc_v2, and so on.
table! {
    "cuGetProcAddress" 11030 cuGetProcAddress;
    "cuGetProcAddress" 12000 cuGetProcAddress_v2;
    "cuInit" 2000 cuInit;
    "cuDriverGetVersion" 2020 cuDriverGetVersion;
    "cuGetErrorName" 6000 cuGetErrorName;
    "cuGetErrorString" 6000 cuGetErrorString;
    "cuDeviceGet" 2000 cuDeviceGet;
    "cuDeviceGetCount" 2000 cuDeviceGetCount;
    "cuDeviceGetName" 2000 cuDeviceGetName;
    "cuDeviceGetUuid" 9020 cuDeviceGetUuid;
    "cuDeviceGetUuid" 11040 cuDeviceGetUuid_v2;
    "cuDeviceTotalMem" 2000 cuDeviceTotalMem;
    "cuDeviceTotalMem" 3020 cuDeviceTotalMem_v2;
    "cuDeviceGetAttribute" 2000 cuDeviceGetAttribute;
    "cuDeviceComputeCapability" 2000 cuDeviceComputeCapability;
    "cuDeviceGetPCIBusId" 4010 cuDeviceGetPCIBusId;
    "cuDeviceCanAccessPeer" 4000 cuDeviceCanAccessPeer;
    "cuDeviceGetDefaultMemPool" 11020 cuDeviceGetDefaultMemPool;
    "cuDeviceGetMemPool" 11020 cuDeviceGetMemPool;
    "cuDevicePrimaryCtxRetain" 7000 cuDevicePrimaryCtxRetain;
    "cuDevicePrimaryCtxRelease" 7000 cuDevicePrimaryCtxRelease;
    "cuDevicePrimaryCtxRelease" 11000 cuDevicePrimaryCtxRelease_v2;
    "cuDevicePrimaryCtxReset" 7000 cuDevicePrimaryCtxReset;
    "cuDevicePrimaryCtxReset" 11000 cuDevicePrimaryCtxReset_v2;
    "cuDevicePrimaryCtxSetFlags" 7000 cuDevicePrimaryCtxSetFlags;
    "cuDevicePrimaryCtxSetFlags" 11000 cuDevicePrimaryCtxSetFlags_v2;
    "cuDevicePrimaryCtxGetState" 7000 cuDevicePrimaryCtxGetState;
    "cuCtxCreate" 2000 cuCtxCreate;
    "cuCtxCreate" 3020 cuCtxCreate_v2;
    "cuCtxCreate" 11040 cuCtxCreate_v3;
    "cuCtxCreate" 12050 cuCtxCreate_v4;
    "cuCtxDestroy" 2000 cuCtxDestroy;
    "cuCtxDestroy" 4000 cuCtxDestroy_v2;
    "cuCtxPushCurrent" 2000 cuCtxPushCurrent;
    "cuCtxPushCurrent" 4000 cuCtxPushCurrent_v2;
    "cuCtxPopCurrent" 2000 cuCtxPopCurrent;
    "cuCtxPopCurrent" 4000 cuCtxPopCurrent_v2;
    "cuCtxGetCurrent" 4000 cuCtxGetCurrent;
    "cuCtxSetCurrent" 4000 cuCtxSetCurrent;
    "cuCtxGetDevice" 2000 cuCtxGetDevice;
    "cuCtxGetFlags" 7000 cuCtxGetFlags;
    "cuCtxGetApiVersion" 3020 cuCtxGetApiVersion;
    "cuCtxGetStreamPriorityRange" 5050 cuCtxGetStreamPriorityRange;
    "cuCtxSynchronize" 2000 cuCtxSynchronize;
    "cuModuleLoad" 2000 cuModuleLoad;
    "cuModuleLoadData" 2000 cuModuleLoadData;
    "cuModuleLoadDataEx" 2010 cuModuleLoadDataEx;
    "cuModuleUnload" 2000 cuModuleUnload;
    "cuModuleGetFunction" 2000 cuModuleGetFunction;
    "cuFuncGetAttribute" 2020 cuFuncGetAttribute;
    "cuFuncSetAttribute" 9000 cuFuncSetAttribute;
    "cuStreamCreate" 2000 cuStreamCreate;
    "cuStreamCreateWithPriority" 5050 cuStreamCreateWithPriority;
    "cuStreamDestroy" 2000 cuStreamDestroy;
    "cuStreamDestroy" 4000 cuStreamDestroy_v2;
    "cuStreamSynchronize" 2000 cuStreamSynchronize | cuStreamSynchronize_ptsz;
    "cuStreamQuery" 2000 cuStreamQuery | cuStreamQuery_ptsz;
    "cuStreamWaitEvent" 3020 cuStreamWaitEvent | cuStreamWaitEvent_ptsz;
    "cuStreamGetPriority" 5050 cuStreamGetPriority | cuStreamGetPriority_ptsz;
    "cuStreamGetFlags" 5050 cuStreamGetFlags | cuStreamGetFlags_ptsz;
    "cuStreamGetCtx" 9020 cuStreamGetCtx | cuStreamGetCtx_ptsz;
    "cuStreamBeginCapture" 10000 cuStreamBeginCapture | cuStreamBeginCapture_ptsz;
    "cuStreamBeginCapture" 10010 cuStreamBeginCapture_v2 | cuStreamBeginCapture_v2_ptsz;
    "cuStreamEndCapture" 10000 cuStreamEndCapture | cuStreamEndCapture_ptsz;
    "cuStreamIsCapturing" 10000 cuStreamIsCapturing | cuStreamIsCapturing_ptsz;
    "cuEventCreate" 2000 cuEventCreate;
    "cuEventDestroy" 2000 cuEventDestroy;
    "cuEventDestroy" 4000 cuEventDestroy_v2;
    "cuEventRecord" 2000 cuEventRecord | cuEventRecord_ptsz;
    "cuEventRecordWithFlags" 11010 cuEventRecordWithFlags | cuEventRecordWithFlags_ptsz;
    "cuEventQuery" 2000 cuEventQuery;
    "cuEventSynchronize" 2000 cuEventSynchronize;
    "cuEventElapsedTime" 2000 cuEventElapsedTime;
    "cuEventElapsedTime" 12080 cuEventElapsedTime_v2;
    "cuMemAlloc" 2000 cuMemAlloc;
    "cuMemAlloc" 3020 cuMemAlloc_v2;
    "cuMemAllocPitch" 2000 cuMemAllocPitch;
    "cuMemAllocPitch" 3020 cuMemAllocPitch_v2;
    "cuMemAllocManaged" 6000 cuMemAllocManaged;
    "cuMemAllocHost" 3020 cuMemAllocHost_v2;
    "cuMemFreeHost" 2000 cuMemFreeHost;
    "cuMemFree" 2000 cuMemFree;
    "cuMemFree" 3020 cuMemFree_v2;
    "cuMemGetInfo" 2000 cuMemGetInfo;
    "cuMemGetInfo" 3020 cuMemGetInfo_v2;
    "cuMemGetAddressRange" 3020 cuMemGetAddressRange_v2;
    "cuMemAllocAsync" 11020 cuMemAllocAsync | cuMemAllocAsync_ptsz;
    "cuMemAllocFromPoolAsync" 11020 cuMemAllocFromPoolAsync | cuMemAllocFromPoolAsync_ptsz;
    "cuMemFreeAsync" 11020 cuMemFreeAsync | cuMemFreeAsync_ptsz;
    "cuMemPoolCreate" 11020 cuMemPoolCreate;
    "cuMemPoolDestroy" 11020 cuMemPoolDestroy;
    "cuMemPoolSetAttribute" 11020 cuMemPoolSetAttribute;
    "cuMemPoolGetAttribute" 11020 cuMemPoolGetAttribute;
    "cuMemPoolTrimTo" 11020 cuMemPoolTrimTo;
    "cuMemGetAllocationGranularity" 10020 cuMemGetAllocationGranularity;
    "cuMemCreate" 10020 cuMemCreate;
    "cuMemRelease" 10020 cuMemRelease;
    "cuMemAddressReserve" 10020 cuMemAddressReserve;
    "cuMemAddressFree" 10020 cuMemAddressFree;
    "cuMemMap" 10020 cuMemMap;
    "cuMemRetainAllocationHandle" 11000 cuMemRetainAllocationHandle;
    "cuMemUnmap" 10020 cuMemUnmap;
    "cuMemSetAccess" 10020 cuMemSetAccess;
    "cuArrayCreate" 2000 cuArrayCreate;
    "cuArrayCreate" 3020 cuArrayCreate_v2;
    "cuArray3DCreate" 3020 cuArray3DCreate_v2;
    "cuArrayDestroy" 2000 cuArrayDestroy;
    "cuMipmappedArrayCreate" 5000 cuMipmappedArrayCreate;
    "cuMipmappedArrayDestroy" 5000 cuMipmappedArrayDestroy;
    "cuMemcpyHtoD" 3020 cuMemcpyHtoD_v2 | cuMemcpyHtoD_v2_ptds;
    "cuMemcpyDtoH" 3020 cuMemcpyDtoH_v2 | cuMemcpyDtoH_v2_ptds;
    "cuMemcpyDtoD" 3020 cuMemcpyDtoD_v2 | cuMemcpyDtoD_v2_ptds;
    "cuMemcpyHtoDAsync" 3020 cuMemcpyHtoDAsync_v2 | cuMemcpyHtoDAsync_v2_ptsz;
    "cuMemcpyDtoHAsync" 3020 cuMemcpyDtoHAsync_v2 | cuMemcpyDtoHAsync_v2_ptsz;
    "cuMemsetD8" 3020 cuMemsetD8_v2 | cuMemsetD8_v2_ptds;
    "cuMemsetD8Async" 3020 cuMemsetD8Async | cuMemsetD8Async_ptsz;
    "cuLaunchKernel" 4000 cuLaunchKernel | cuLaunchKernel_ptsz;
    "cuLaunchKernelEx" 11060 cuLaunchKernelEx | cuLaunchKernelEx_ptsz;
    "cuLaunchCooperativeKernel" 9000 cuLaunchCooperativeKernel | cuLaunchCooperativeKernel_ptsz;
    "cuLaunchCooperativeKernelMultiDevice" 9000 cuLaunchCooperativeKernelMultiDevice;
    "cuLaunchHostFunc" 10000 cuLaunchHostFunc | cuLaunchHostFunc_ptsz;
    "cuGraphInstantiate" 10000 cuGraphInstantiate;
    "cuGraphInstantiate" 11000 cuGraphInstantiate_v2;
    "cuGraphInstantiate" 12000 cuGraphInstantiateWithFlags;
    "cuGraphInstantiateWithFlags" 11040 cuGraphInstantiateWithFlags;
    "cuGraphInstantiateWithParams" 12000 cuGraphInstantiateWithParams;
    "cuGraphAddMemAllocNode" 11040 cuGraphAddMemAllocNode;
    "cuGraphLaunch" 10000 cuGraphLaunch | cuGraphLaunch_ptsz;
    "cuGraphExecDestroy" 10000 cuGraphExecDestroy;
    "cuGraphDestroy" 10000 cuGraphDestroy;
}

pub fn entries() -> &'static [Entry] {
    static T: OnceLock<Vec<Entry>> = OnceLock::new();
    T.get_or_init(build)
}

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
const PER_THREAD: u64 = 0x2;
/// CUdriverProcAddressQueryResult values.
const STATUS_SUCCESS: c_int = 0;
const STATUS_NOT_FOUND: c_int = 1;
const STATUS_VERSION_NOT_SUFFICIENT: c_int = 2;

/// The export a request resolves to: `Ok((name, address))`, or the query status on failure.
pub fn resolve(base: &str, version: c_int, flags: u64) -> Result<(&'static str, usize), c_int> {
    let mut known = false;
    let mut best: Option<&Entry> = None;
    for e in entries().iter().filter(|e| e.base == base) {
        known = true;
        if version >= 0 && e.since <= version as u32 && best.is_none_or(|b| e.since > b.since) {
            best = Some(e);
        }
    }
    match best {
        Some(e) => Ok(match (flags & PER_THREAD != 0, e.per_thread) {
            (true, Some(pt)) => pt,
            _ => (e.export, e.addr),
        }),
        None if known => Err(STATUS_VERSION_NOT_SUFFICIENT),
        None => Err(STATUS_NOT_FOUND),
    }
}

pub fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> Result<(), R> {
    if symbol.is_null() || pfn.is_null() || flags > 0x2 {
        return Err(E::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, NUL-terminated per the API contract.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    let set_status = |s: c_int| {
        if !status.is_null() {
            // SAFETY: optional out-parameter supplied by the caller.
            unsafe { *status = s };
        }
    };
    match resolve(name, version, flags) {
        Ok((_, addr)) => {
            // SAFETY: pfn checked non-null above.
            unsafe { *pfn = addr as *mut c_void };
            set_status(STATUS_SUCCESS);
            Ok(())
        }
        Err(s) => {
            // SAFETY: as above.
            unsafe { *pfn = std::ptr::null_mut() };
            set_status(s);
            Err(E::CUDA_ERROR_NOT_FOUND)
        }
    }
}

/// Name and description of a CUresult code, NUL-terminated for C callers.
pub fn error_text(code: u32) -> Option<(&'static CStr, &'static CStr)> {
    Some(match code {
        0 => (c"CUDA_SUCCESS", c"no error"),
        1 => (c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
        2 => (c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
        3 => (c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
        4 => (c"CUDA_ERROR_DEINITIALIZED", c"driver shutting down"),
        100 => (
            c"CUDA_ERROR_NO_DEVICE",
            c"no CUDA-capable device is detected",
        ),
        101 => (c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
        200 => (
            c"CUDA_ERROR_INVALID_IMAGE",
            c"device kernel image is invalid",
        ),
        201 => (c"CUDA_ERROR_INVALID_CONTEXT", c"invalid device context"),
        301 => (c"CUDA_ERROR_FILE_NOT_FOUND", c"file not found"),
        400 => (c"CUDA_ERROR_INVALID_HANDLE", c"invalid resource handle"),
        401 => (
            c"CUDA_ERROR_ILLEGAL_STATE",
            c"the operation cannot be performed in the present state",
        ),
        500 => (c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
        600 => (c"CUDA_ERROR_NOT_READY", c"device not ready"),
        801 => (c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
        900 => (
            c"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
            c"operation not permitted when stream is capturing",
        ),
        999 => (c"CUDA_ERROR_UNKNOWN", c"unknown error"),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_variant_not_newer_than_requested() {
        assert_eq!(resolve("cuMemAlloc", 12000, 0).unwrap().0, "cuMemAlloc_v2");
        assert_eq!(resolve("cuMemAlloc", 3010, 0).unwrap().0, "cuMemAlloc");
        assert_eq!(
            resolve("cuCtxCreate", 11040, 0).unwrap().0,
            "cuCtxCreate_v3"
        );
        assert_eq!(
            resolve("cuCtxCreate", 13000, 0).unwrap().0,
            "cuCtxCreate_v4"
        );
        assert_eq!(
            resolve("cuGraphInstantiate", 12000, 0).unwrap().0,
            "cuGraphInstantiateWithFlags"
        );
        assert_eq!(
            resolve("cuGraphInstantiate", 11080, 0).unwrap().0,
            "cuGraphInstantiate_v2"
        );
        assert_eq!(
            resolve("cuEventElapsedTime", 12080, 0).unwrap().0,
            "cuEventElapsedTime_v2"
        );
        assert_eq!(
            resolve("cuEventElapsedTime", 12000, 0).unwrap().0,
            "cuEventElapsedTime"
        );
        assert_eq!(
            resolve("cuGetProcAddress", 12000, 0).unwrap().0,
            "cuGetProcAddress_v2"
        );
    }

    #[test]
    fn per_thread_flag_picks_ptsz_and_ptds() {
        assert_eq!(
            resolve("cuLaunchKernel", 12000, 2).unwrap().0,
            "cuLaunchKernel_ptsz"
        );
        assert_eq!(
            resolve("cuLaunchKernel", 12000, 1).unwrap().0,
            "cuLaunchKernel"
        );
        assert_eq!(
            resolve("cuMemcpyHtoD", 13000, 2).unwrap().0,
            "cuMemcpyHtoD_v2_ptds"
        );
        assert_eq!(
            resolve("cuStreamBeginCapture", 12000, 2).unwrap().0,
            "cuStreamBeginCapture_v2_ptsz"
        );
        // No per-thread form: the plain export.
        assert_eq!(resolve("cuMemAlloc", 12000, 2).unwrap().0, "cuMemAlloc_v2");
    }

    #[test]
    fn unknown_and_too_old() {
        assert_eq!(resolve("cuNoSuchThing", 12000, 0), Err(STATUS_NOT_FOUND));
        assert_eq!(resolve("cuMemAlloc_v2", 12000, 0), Err(STATUS_NOT_FOUND));
        assert_eq!(
            resolve("cuLaunchKernelEx", 11000, 0),
            Err(STATUS_VERSION_NOT_SUFFICIENT)
        );
    }

    #[test]
    fn every_entry_points_at_its_own_export() {
        for e in entries() {
            assert_ne!(e.addr, 0, "{}", e.export);
            assert!(e.export.starts_with(e.base) || e.base == "cuGraphInstantiate");
        }
    }
}
