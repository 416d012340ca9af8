//! The table of hooked exports and of the real driver entry points the shim calls itself.
//!
//! Owns the single list of hooked export names (the ABI variant is part of the name:
//! `cuMemAlloc` vs `cuMemAlloc_v2`, `cuLaunchKernel` vs `cuLaunchKernel_ptsz`) and the pure logic
//! that maps a name to its hook and a real entry point back to the variant it is. Identification
//! is by address: `cuGetProcAddress` answers are compared with the real addresses of every hooked
//! export, so the caller gets the hook of exactly the variant the driver chose for its
//! (symbol, cudaVersion, flags) — never a name-based guess (HAMi's bug). Must never: guess a
//! variant from a base name, or hook a name that is not in this list.

macro_rules! name_enum {
    ($(#[$m:meta])* $vis:vis enum $E:ident in $lib:ident { $($v:ident),* $(,)? }) => {
        $(#[$m])*
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        $vis enum $E { $(#[doc = concat!("`", stringify!($v), "`.")] $v),* }
        impl $E {
            /// Every variant, in index order.
            pub const ALL: &'static [$E] = &[$($E::$v),*];
            /// The exported symbol names, in index order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($v)),*];
            /// How many there are.
            pub const COUNT: usize = Self::NAMES.len();
            /// The exported symbol name.
            #[inline]
            pub fn name(self) -> &'static str { Self::NAMES[self as usize] }
            /// Which library exports it.
            pub fn lib(self) -> Lib {
                if self.name().starts_with("nvml") { Lib::Nvml } else { Lib::$lib }
            }
            /// The variant of exactly this symbol name.
            pub fn from_name(name: &str) -> Option<$E> {
                Self::NAMES.iter().position(|n| *n == name).map(|i| Self::ALL[i])
            }
        }
    };
}

/// The library a symbol belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lib {
    /// `libcuda.so.1`.
    Cuda,
    /// `libnvidia-ml.so.1`.
    Nvml,
}

name_enum! {
    /// Every export the shim defines (and hooks). Order is the index into the real-address and
    /// hook-address tables.
    pub enum Hook in Cuda {
        cuMemAlloc, cuMemAlloc_v2, cuMemAllocPitch, cuMemAllocPitch_v2, cuMemAllocManaged,
        cuMemAllocAsync, cuMemAllocAsync_ptsz, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz,
        cuMemFree, cuMemFree_v2, cuMemFreeAsync, cuMemFreeAsync_ptsz,
        cuMemCreate, cuMemRelease, cuMemMap, cuMemUnmap, cuMemRetainAllocationHandle,
        cuArrayCreate, cuArrayCreate_v2, cuArray3DCreate, cuArray3DCreate_v2, cuArrayDestroy,
        cuMipmappedArrayCreate, cuMipmappedArrayDestroy,
        cuMemGetInfo, cuMemGetInfo_v2, cuDeviceTotalMem, cuDeviceTotalMem_v2,
        cuLaunchKernel, cuLaunchKernel_ptsz, cuLaunchKernelEx, cuLaunchKernelEx_ptsz,
        cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz, cuGraphLaunch, cuGraphLaunch_ptsz,
        cuLaunchCooperativeKernelMultiDevice,
        cuGraphAddMemAllocNode, cuGraphInstantiate, cuGraphInstantiate_v2, cuGraphInstantiateWithFlags,
        cuGraphInstantiateWithParams, cuGraphExecDestroy, cuGraphDestroy,
        cuGetProcAddress, cuGetProcAddress_v2,
        cuDevicePrimaryCtxRetain, cuCtxCreate, cuCtxCreate_v2, cuCtxCreate_v3, cuCtxCreate_v4,
        cuCtxDestroy, cuCtxDestroy_v2, cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2,
        cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2, cuMemPoolCreate, cuMemPoolDestroy,
        nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo_v2,
    }
}

name_enum! {
    /// Real entry points the shim calls for its own purposes (never hooked).
    pub enum Helper in Cuda {
        cuCtxGetDevice, cuCtxGetCurrent, cuStreamIsCapturing, cuStreamIsCapturing_ptsz,
        cuStreamQuery, cuStreamQuery_ptsz,
        cuEventCreate, cuEventRecord, cuEventRecord_ptsz, cuEventQuery, cuEventElapsedTime,
        cuDeviceGetCount, cuDeviceGet, cuDeviceGetUuid, cuMemFree_v2, cuMemFree,
        cuDevicePrimaryCtxGetState, cuDeviceGetMemPool, cuMemPoolGetAttribute, cuMemFreeAsync,
        cuMemFreeAsync_ptsz,
        nvmlInit_v2, nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetIndex, nvmlDeviceGetUUID,
        nvmlDeviceGetHandleByUUID,
        nvmlDeviceGetComputeRunningProcesses_v3, nvmlDeviceGetComputeRunningProcesses_v2,
        nvmlDeviceGetProcessUtilization, nvmlDeviceGetMPSComputeRunningProcesses_v3,
        nvmlDeviceGetMPSComputeRunningProcesses_v2,
        nvmlDeviceGetSamples,
    }
}

/// Cheap pre-filter for the `dlsym` path, which sees every symbol look-up of the process.
#[inline]
pub fn may_be_hooked(name: &[u8]) -> bool {
    name.len() >= 6 && (name.starts_with(b"cu") || name.starts_with(b"nvml"))
}

/// The hook for a symbol name, if we hook it.
pub fn hook_by_name(name: &[u8]) -> Option<Hook> {
    if !may_be_hooked(name) {
        return None;
    }
    let s = std::str::from_utf8(name).ok()?;
    Hook::from_name(s)
}

/// Which hooked CUDA export a real entry point is, given the real addresses by hook index
/// (0 = not resolved). Only CUDA exports: `cuGetProcAddress` hands out driver entry points.
pub fn identify(ptr: usize, real: &[usize]) -> Option<Hook> {
    if ptr == 0 {
        return None;
    }
    real.iter()
        .position(|&a| a == ptr)
        .map(|i| Hook::ALL[i])
        .filter(|h| h.lib() == Lib::Cuda)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hook_is_found_by_its_exact_name_only() {
        for (i, h) in Hook::ALL.iter().enumerate() {
            assert_eq!(*h as usize, i);
            assert_eq!(Hook::from_name(h.name()), Some(*h));
            assert_eq!(hook_by_name(h.name().as_bytes()), Some(*h));
        }
        assert_eq!(Hook::cuMemAlloc_v2.name(), "cuMemAlloc_v2");
        assert_eq!(Hook::nvmlDeviceGetMemoryInfo.lib(), Lib::Nvml);
        assert_eq!(Hook::cuLaunchKernel_ptsz.lib(), Lib::Cuda);
        assert_eq!(
            hook_by_name(b"cuMemcpyHtoD_v2"),
            None,
            "not hooked: passes through"
        );
        assert_eq!(hook_by_name(b"malloc"), None);
        assert_eq!(hook_by_name(b"cu"), None);
    }

    #[test]
    fn identify_by_address_picks_the_exact_variant() {
        let mut real = vec![0usize; Hook::COUNT];
        for (i, a) in real.iter_mut().enumerate() {
            *a = 0x1000 + i * 0x40;
        }
        // The same base name, different ABI variants: each address maps to its own variant.
        for h in [
            Hook::cuLaunchKernel,
            Hook::cuLaunchKernel_ptsz,
            Hook::cuMemAlloc,
            Hook::cuMemAlloc_v2,
            Hook::cuGraphLaunch_ptsz,
            Hook::cuGetProcAddress_v2,
        ] {
            assert_eq!(identify(real[h as usize], &real), Some(h));
        }
        assert_eq!(
            identify(0xdead_0000, &real),
            None,
            "unknown pointer passes through"
        );
        assert_eq!(identify(0, &real), None);
        // NVML entries are never substituted into cuGetProcAddress answers.
        let n = real[Hook::nvmlDeviceGetMemoryInfo as usize];
        assert_eq!(identify(n, &real), None);
        // Unresolved (0) real entries never match.
        real[Hook::cuMemAlloc as usize] = 0;
        assert_eq!(identify(0, &real), None);
    }
}
