//! A table of CUDA driver entry points, filled the three ways real programs fill it:
//!
//! - **Direct linking** (`Resolve::Direct`): the program links `libcuda.so.1` and calls the exported
//!   names that `cuda.h`'s macros produce (`cuMemAlloc` → `cuMemAlloc_v2`; with
//!   `CUDA_API_PER_THREAD_DEFAULT_STREAM`, `cuLaunchKernel` → `cuLaunchKernel_ptsz`). Only the
//!   `sim-probe-linked` binary links the driver; it passes its table in through [`DirectTable`].
//! - **dlopen + dlsym** (`Resolve::Dlsym`): `dlopen("libcuda.so.1")`, then `dlsym` of the same
//!   exported names (how NCCL, Triton and many plugins do it).
//! - **The CUDA runtime's way** (`Resolve::ProcAddress`): `dlsym(handle, "cuGetProcAddress_v2")`,
//!   then every entry point through it by *base name* with a `cudaVersion` and flags (how
//!   libcudart ≥ 11.3, and therefore PyTorch, does it).
//!
//! Return codes are read as raw `u32`: a code this table does not know must not be UB.

use anyhow::{anyhow, bail, Context, Result};
use cudarc::driver::sys::{CUdeviceptr, CUlaunchConfig};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

/// A driver return code (`CUresult`; 0 is `CUDA_SUCCESS`).
pub type CuResult = u32;
/// An opaque driver handle or device/host pointer, passed through to the driver untouched.
pub type Ptr = *mut c_void;

/// How the entry points were obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolve {
    /// Symbols the binary linked against `libcuda.so.1` (only `sim-probe-linked`).
    Direct {
        /// Use the per-thread default stream exports (`_ptsz` / `_ptds`).
        per_thread: bool,
    },
    /// `dlsym` on the `dlopen`ed driver library.
    Dlsym {
        /// Use the per-thread default stream exports (`_ptsz` / `_ptds`).
        per_thread: bool,
    },
    /// `cuGetProcAddress`, as the CUDA runtime does.
    ProcAddress {
        /// The `cudaVersion` argument (e.g. 12080 for 12.8); selects the versioned export.
        cuda_version: i32,
        /// Ask for the per-thread default stream variants (`CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`).
        per_thread: bool,
    },
}

impl Resolve {
    /// Parses the `--resolve` / `--cuda-version` / `--per-thread` options every client takes.
    pub fn parse(kind: &str, cuda_version: i32, per_thread: bool) -> Result<Self> {
        Ok(match kind {
            "direct" => Resolve::Direct { per_thread },
            "dlsym" => Resolve::Dlsym { per_thread },
            "procaddr" => Resolve::ProcAddress {
                cuda_version,
                per_thread,
            },
            other => bail!("unknown --resolve {other:?}: expected direct, dlsym or procaddr"),
        })
    }
}

macro_rules! driver_api {
    ($( $field:ident : $base:literal => $export:ident $(| $pt:ident)? : fn($($arg:ty),*) ; )*) => {
        /// Driver entry points used by the client programs.
        #[allow(non_snake_case)]
        pub struct Driver {
            $(
                #[doc = concat!("The driver's `", $base, "` entry point.")]
                pub $field: unsafe extern "C" fn($($arg),*) -> CuResult,
            )*
            /// How the entry points above were obtained.
            pub resolve: Resolve,
            /// For each field: the base name and the export it was resolved from (diagnostics).
            pub names: Vec<(&'static str, String)>,
        }

        impl Driver {
            fn from_lookup(
                resolve: Resolve,
                mut lookup: impl FnMut(&'static str, &'static str, Option<&'static str>) -> Result<(Ptr, String)>,
            ) -> Result<Self> {
                let mut names = Vec::new();
                $(
                    let $field = {
                        let (p, name) = lookup($base, stringify!($export), driver_api!(@pt $($pt)?))?;
                        names.push(($base, name));
                        // SAFETY: the pointer was resolved for exactly this entry point and ABI
                        // variant; the signature is the one cuda.h declares for it.
                        unsafe { std::mem::transmute::<Ptr, unsafe extern "C" fn($($arg),*) -> CuResult>(p) }
                    };
                )*
                Ok(Driver { $($field,)* resolve, names })
            }
        }

        /// Generates, inside a binary that links `libcuda.so.1`, the extern declarations of every
        /// export above and a `direct_table(per_thread)` that fills a [`DirectTable`] from them.
        #[macro_export]
        macro_rules! declare_direct_driver {
            () => {
                #[link(name = "cuda")]
                extern "C" {
                    $( fn $export(); $( fn $pt(); )? )*
                }
                fn direct_table(per_thread: bool) -> $crate::driver::DirectTable {
                    let mut t = $crate::driver::DirectTable::default();
                    $(
                        #[allow(unused_mut)]
                        let mut p = ($export as unsafe extern "C" fn() as *mut std::ffi::c_void, stringify!($export));
                        $( if per_thread { p = ($pt as unsafe extern "C" fn() as *mut std::ffi::c_void, stringify!($pt)); } )?
                        t.entries.push(($base, p.0, p.1));
                    )*
                    t
                }
            };
        }
    };
    (@pt $pt:ident) => { Some(stringify!($pt)) };
    (@pt) => { None };
}

driver_api! {
    cuInit: "cuInit" => cuInit : fn(c_uint);
    cuDeviceGet: "cuDeviceGet" => cuDeviceGet : fn(*mut c_int, c_int);
    cuDeviceGetCount: "cuDeviceGetCount" => cuDeviceGetCount : fn(*mut c_int);
    cuDeviceGetName: "cuDeviceGetName" => cuDeviceGetName : fn(*mut c_char, c_int, c_int);
    cuDeviceTotalMem: "cuDeviceTotalMem" => cuDeviceTotalMem_v2 : fn(*mut usize, c_int);
    cuDeviceGetAttribute: "cuDeviceGetAttribute" => cuDeviceGetAttribute : fn(*mut c_int, c_int, c_int);
    cuDevicePrimaryCtxRetain: "cuDevicePrimaryCtxRetain" => cuDevicePrimaryCtxRetain : fn(*mut Ptr, c_int);
    cuDevicePrimaryCtxRelease: "cuDevicePrimaryCtxRelease" => cuDevicePrimaryCtxRelease_v2 : fn(c_int);
    cuCtxSetCurrent: "cuCtxSetCurrent" => cuCtxSetCurrent : fn(Ptr);
    cuCtxSynchronize: "cuCtxSynchronize" => cuCtxSynchronize : fn();
    cuModuleLoadData: "cuModuleLoadData" => cuModuleLoadData : fn(*mut Ptr, *const c_void);
    cuModuleGetFunction: "cuModuleGetFunction" => cuModuleGetFunction : fn(*mut Ptr, Ptr, *const c_char);
    cuStreamCreate: "cuStreamCreate" => cuStreamCreate : fn(*mut Ptr, c_uint);
    cuStreamSynchronize: "cuStreamSynchronize" => cuStreamSynchronize | cuStreamSynchronize_ptsz : fn(Ptr);
    cuStreamDestroy: "cuStreamDestroy" => cuStreamDestroy_v2 : fn(Ptr);
    cuEventCreate: "cuEventCreate" => cuEventCreate : fn(*mut Ptr, c_uint);
    cuEventRecord: "cuEventRecord" => cuEventRecord | cuEventRecord_ptsz : fn(Ptr, Ptr);
    cuEventSynchronize: "cuEventSynchronize" => cuEventSynchronize : fn(Ptr);
    cuEventElapsedTime: "cuEventElapsedTime" => cuEventElapsedTime : fn(*mut f32, Ptr, Ptr);
    cuEventDestroy: "cuEventDestroy" => cuEventDestroy_v2 : fn(Ptr);
    cuMemAlloc: "cuMemAlloc" => cuMemAlloc_v2 : fn(*mut CUdeviceptr, usize);
    cuMemAllocPitch: "cuMemAllocPitch" => cuMemAllocPitch_v2 : fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint);
    cuMemAllocManaged: "cuMemAllocManaged" => cuMemAllocManaged : fn(*mut CUdeviceptr, usize, c_uint);
    cuMemFree: "cuMemFree" => cuMemFree_v2 : fn(CUdeviceptr);
    cuMemGetInfo: "cuMemGetInfo" => cuMemGetInfo_v2 : fn(*mut usize, *mut usize);
    cuMemAllocAsync: "cuMemAllocAsync" => cuMemAllocAsync | cuMemAllocAsync_ptsz : fn(*mut CUdeviceptr, usize, Ptr);
    cuMemAllocFromPoolAsync: "cuMemAllocFromPoolAsync" => cuMemAllocFromPoolAsync | cuMemAllocFromPoolAsync_ptsz : fn(*mut CUdeviceptr, usize, Ptr, Ptr);
    cuMemFreeAsync: "cuMemFreeAsync" => cuMemFreeAsync | cuMemFreeAsync_ptsz : fn(CUdeviceptr, Ptr);
    cuDeviceGetDefaultMemPool: "cuDeviceGetDefaultMemPool" => cuDeviceGetDefaultMemPool : fn(*mut Ptr, c_int);
    cuMemPoolGetAttribute: "cuMemPoolGetAttribute" => cuMemPoolGetAttribute : fn(Ptr, c_int, *mut c_void);
    cuMemPoolSetAttribute: "cuMemPoolSetAttribute" => cuMemPoolSetAttribute : fn(Ptr, c_int, *mut c_void);
    cuMemPoolCreate: "cuMemPoolCreate" => cuMemPoolCreate : fn(*mut Ptr, *const c_void);
    cuMemPoolDestroy: "cuMemPoolDestroy" => cuMemPoolDestroy : fn(Ptr);
    cuMemPoolTrimTo: "cuMemPoolTrimTo" => cuMemPoolTrimTo : fn(Ptr, usize);
    cuMemCreate: "cuMemCreate" => cuMemCreate : fn(*mut u64, usize, *const c_void, u64);
    cuMemRelease: "cuMemRelease" => cuMemRelease : fn(u64);
    cuMemAddressReserve: "cuMemAddressReserve" => cuMemAddressReserve : fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, u64);
    cuMemAddressFree: "cuMemAddressFree" => cuMemAddressFree : fn(CUdeviceptr, usize);
    cuMemMap: "cuMemMap" => cuMemMap : fn(CUdeviceptr, usize, usize, u64, u64);
    cuMemUnmap: "cuMemUnmap" => cuMemUnmap : fn(CUdeviceptr, usize);
    cuMemSetAccess: "cuMemSetAccess" => cuMemSetAccess : fn(CUdeviceptr, usize, *const c_void, usize);
    cuMemRetainAllocationHandle: "cuMemRetainAllocationHandle" => cuMemRetainAllocationHandle : fn(*mut u64, *mut c_void);
    cuArrayCreate: "cuArrayCreate" => cuArrayCreate_v2 : fn(*mut Ptr, *const c_void);
    cuArray3DCreate: "cuArray3DCreate" => cuArray3DCreate_v2 : fn(*mut Ptr, *const c_void);
    cuArrayDestroy: "cuArrayDestroy" => cuArrayDestroy : fn(Ptr);
    cuMipmappedArrayCreate: "cuMipmappedArrayCreate" => cuMipmappedArrayCreate : fn(*mut Ptr, *const c_void, c_uint);
    cuMipmappedArrayDestroy: "cuMipmappedArrayDestroy" => cuMipmappedArrayDestroy : fn(Ptr);
    cuLaunchKernel: "cuLaunchKernel" => cuLaunchKernel | cuLaunchKernel_ptsz : fn(Ptr, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Ptr, *mut Ptr, *mut Ptr);
    cuLaunchKernelEx: "cuLaunchKernelEx" => cuLaunchKernelEx | cuLaunchKernelEx_ptsz : fn(*const CUlaunchConfig, Ptr, *mut Ptr, *mut Ptr);
    cuLaunchCooperativeKernel: "cuLaunchCooperativeKernel" => cuLaunchCooperativeKernel | cuLaunchCooperativeKernel_ptsz : fn(Ptr, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Ptr, *mut Ptr);
    cuLaunchCooperativeKernelMultiDevice: "cuLaunchCooperativeKernelMultiDevice" => cuLaunchCooperativeKernelMultiDevice : fn(*mut cudarc::driver::sys::CUDA_LAUNCH_PARAMS, c_uint, c_uint);
    cuStreamBeginCapture: "cuStreamBeginCapture" => cuStreamBeginCapture_v2 | cuStreamBeginCapture_v2_ptsz : fn(Ptr, c_uint);
    cuStreamEndCapture: "cuStreamEndCapture" => cuStreamEndCapture | cuStreamEndCapture_ptsz : fn(Ptr, *mut Ptr);
    cuGraphInstantiate: "cuGraphInstantiate" => cuGraphInstantiateWithFlags : fn(*mut Ptr, Ptr, u64);
    cuGraphAddMemAllocNode: "cuGraphAddMemAllocNode" => cuGraphAddMemAllocNode : fn(*mut Ptr, Ptr, *const Ptr, usize, *mut c_void);
    cuGraphLaunch: "cuGraphLaunch" => cuGraphLaunch | cuGraphLaunch_ptsz : fn(Ptr, Ptr);
    cuGraphExecDestroy: "cuGraphExecDestroy" => cuGraphExecDestroy : fn(Ptr);
    cuGraphDestroy: "cuGraphDestroy" => cuGraphDestroy : fn(Ptr);
}

/// Entry points of a binary that links the driver directly: (base, address, export name).
#[derive(Default)]
pub struct DirectTable {
    /// One row per entry point: base name, address of the linked symbol, its export name.
    pub entries: Vec<(&'static str, Ptr, &'static str)>,
}

type GetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut Ptr, c_int, u64, *mut c_int) -> CuResult;
type GetProcAddressV1 = unsafe extern "C" fn(*const c_char, *mut Ptr, c_int, u64) -> CuResult;

/// `dlopen("libcuda.so.1")` once per process.
pub fn libcuda_handle() -> Result<Ptr> {
    let name = c"libcuda.so.1";
    // SAFETY: valid NUL-terminated name; RTLD_NOW so missing symbols fail here, not mid-run.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a valid C string or null.
        let err = unsafe { libc::dlerror() };
        let msg = if err.is_null() {
            "unknown".to_string()
        } else {
            // SAFETY: non-null dlerror result is a C string.
            unsafe { CStr::from_ptr(err) }
                .to_string_lossy()
                .into_owned()
        };
        bail!("dlopen(libcuda.so.1) failed: {msg} (is LD_LIBRARY_PATH set to the simulated GPU's lib dir?)");
    }
    Ok(h)
}

fn dlsym(handle: Ptr, name: &str) -> Result<Ptr> {
    let c = CString::new(name)?;
    // SAFETY: valid handle from dlopen and NUL-terminated name.
    let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
    if p.is_null() {
        bail!("dlsym({name}) found nothing");
    }
    Ok(p)
}

impl Driver {
    /// Resolves every entry point the given way. `direct` must be provided for `Resolve::Direct`.
    pub fn load(resolve: Resolve, direct: Option<&dyn Fn(bool) -> DirectTable>) -> Result<Self> {
        match resolve {
            Resolve::Direct { per_thread } => {
                let f = direct.ok_or_else(|| {
                    anyhow!("--resolve direct needs the driver-linked binary (sim-probe-linked)")
                })?;
                let table = f(per_thread);
                let mut it = table.entries.into_iter();
                Driver::from_lookup(resolve, |base, _, _| {
                    let (b, p, name) =
                        it.next().ok_or_else(|| anyhow!("direct table too short"))?;
                    debug_assert_eq!(b, base);
                    Ok((p, name.to_string()))
                })
            }
            Resolve::Dlsym { per_thread } => {
                let h = libcuda_handle()?;
                Driver::from_lookup(resolve, |_, export, pt| {
                    let name = match (per_thread, pt) {
                        (true, Some(pt)) => pt,
                        _ => export,
                    };
                    Ok((dlsym(h, name)?, name.to_string()))
                })
            }
            Resolve::ProcAddress {
                cuda_version,
                per_thread,
            } => {
                let h = libcuda_handle()?;
                let flags: u64 = if per_thread { 2 } else { 1 };
                let v2: Option<GetProcAddressV2> = if cuda_version >= 12000 {
                    // SAFETY: the exported cuGetProcAddress_v2 has exactly this signature.
                    Some(unsafe {
                        std::mem::transmute::<Ptr, GetProcAddressV2>(dlsym(
                            h,
                            "cuGetProcAddress_v2",
                        )?)
                    })
                } else {
                    None
                };
                let v1: GetProcAddressV1 =
                    // SAFETY: the exported cuGetProcAddress has exactly this signature.
                    unsafe { std::mem::transmute::<Ptr, GetProcAddressV1>(dlsym(h, "cuGetProcAddress")?) };
                Driver::from_lookup(resolve, |base, _, _| {
                    let c = CString::new(base)?;
                    let mut p: Ptr = std::ptr::null_mut();
                    let mut status: c_int = -1;
                    // SAFETY: valid name, out-pointers to locals.
                    let rc = unsafe {
                        match v2 {
                            Some(f) => f(c.as_ptr(), &mut p, cuda_version, flags, &mut status),
                            None => v1(c.as_ptr(), &mut p, cuda_version, flags),
                        }
                    };
                    if rc != 0 || p.is_null() {
                        bail!("cuGetProcAddress({base}, {cuda_version}, {flags}) = {rc} (status {status})");
                    }
                    Ok((p, format!("{base}@{cuda_version}")))
                })
            }
        }
    }

    /// Turns a return code into an error carrying its number (and name when the driver knows it).
    pub fn check(&self, rc: CuResult, what: &str) -> Result<()> {
        if rc == 0 {
            Ok(())
        } else {
            Err(anyhow!(CudaError {
                code: rc,
                what: what.to_string()
            }))
        }
    }
}

/// A failed driver call.
#[derive(Debug)]
pub struct CudaError {
    /// The `CUresult` the call returned.
    pub code: u32,
    /// Which call failed (its driver name).
    pub what: String,
}

impl std::fmt::Display for CudaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed with CUresult {}", self.what, self.code)
    }
}

impl std::error::Error for CudaError {}

/// An initialised device: driver table, primary context made current, module of timed kernels.
pub struct Session {
    /// The resolved driver entry points.
    pub drv: Driver,
    /// The device's primary context, current on the thread that opened the session.
    pub ctx: Ptr,
    /// The driver's device handle (`CUdevice`).
    pub device: c_int,
    /// The loaded module of timed kernels (see [`module_image`]).
    pub module: Ptr,
}

/// Text module image understood by the simulated driver: `<kernel> <duration_us>` per line.
pub fn module_image(kernels: &[(&str, f64)]) -> CString {
    let mut s = String::from("smore-sim-module\n");
    for (name, us) in kernels {
        s.push_str(&format!("{name} {us}\n"));
    }
    CString::new(s).expect("no NUL in module text")
}

impl Session {
    /// cuInit, device `ordinal`, primary context retained and made current, module loaded.
    pub fn open(drv: Driver, ordinal: c_int, kernels: &[(&str, f64)]) -> Result<Self> {
        // SAFETY: calls through entry points resolved for these exact signatures, with valid
        // out-pointers to locals.
        unsafe {
            drv.check((drv.cuInit)(0), "cuInit")?;
            let mut dev = 0;
            drv.check((drv.cuDeviceGet)(&mut dev, ordinal), "cuDeviceGet")?;
            let mut ctx = std::ptr::null_mut();
            drv.check(
                (drv.cuDevicePrimaryCtxRetain)(&mut ctx, dev),
                "cuDevicePrimaryCtxRetain",
            )?;
            drv.check((drv.cuCtxSetCurrent)(ctx), "cuCtxSetCurrent")?;
            let image = module_image(kernels);
            let mut module = std::ptr::null_mut();
            drv.check(
                (drv.cuModuleLoadData)(&mut module, image.as_ptr() as *const c_void),
                "cuModuleLoadData",
            )?;
            Ok(Session {
                drv,
                ctx,
                device: dev,
                module,
            })
        }
    }

    /// Looks up kernel `name` in the session's module (`cuModuleGetFunction`).
    pub fn function(&self, name: &str) -> Result<Ptr> {
        let c = CString::new(name)?;
        let mut f = std::ptr::null_mut();
        // SAFETY: valid module handle and name.
        let rc = unsafe { (self.drv.cuModuleGetFunction)(&mut f, self.module, c.as_ptr()) };
        self.drv.check(rc, "cuModuleGetFunction")?;
        Ok(f)
    }

    /// Launches `f` with a 1×1×1 grid of 128 threads on `stream`.
    // Handles are opaque driver objects, passed through for the driver to validate.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn launch(&self, f: Ptr, stream: Ptr) -> Result<()> {
        // SAFETY: f and stream are handles of this driver; no kernel parameters.
        let rc = unsafe {
            (self.drv.cuLaunchKernel)(
                f,
                1,
                1,
                1,
                128,
                1,
                1,
                0,
                stream,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        self.drv.check(rc, "cuLaunchKernel")
    }

    /// Launches the simulated driver's `smore_sim_spin` kernel `f` (duration from its first
    /// argument) for `ns` nanoseconds on `stream`, 1×1×1 grid of 128 threads.
    // Handles are opaque driver objects, passed through for the driver to validate.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn launch_spin(&self, f: Ptr, stream: Ptr, ns: u64) -> Result<()> {
        let mut dur = ns;
        let mut p0: Ptr = &mut dur as *mut u64 as Ptr;
        let params: *mut Ptr = &mut p0;
        // SAFETY: f and stream are handles of this driver; `params` points to one pointer to a
        // u64, the spin kernel's one parameter, alive for the call (the driver reads it at
        // launch, as cuLaunchKernel specifies).
        let rc = unsafe {
            (self.drv.cuLaunchKernel)(
                f,
                1,
                1,
                1,
                128,
                1,
                1,
                0,
                stream,
                params,
                std::ptr::null_mut(),
            )
        };
        self.drv.check(rc, "cuLaunchKernel")
    }

    /// Waits until everything queued on `stream` (null: the default stream) has run.
    // Handles are opaque driver objects, passed through for the driver to validate.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn sync(&self, stream: Ptr) -> Result<()> {
        // SAFETY: stream is a handle of this driver (or null for the default stream).
        let rc = unsafe { (self.drv.cuStreamSynchronize)(stream) };
        self.drv.check(rc, "cuStreamSynchronize")
    }

    /// Creates an event (default flags: timing enabled).
    pub fn new_event(&self) -> Result<Ptr> {
        let mut e = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        let rc = unsafe { (self.drv.cuEventCreate)(&mut e, 0) };
        self.drv.check(rc, "cuEventCreate")?;
        Ok(e)
    }

    /// Records `event` on `stream`.
    // Handles are opaque driver objects, passed through for the driver to validate.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn record(&self, event: Ptr, stream: Ptr) -> Result<()> {
        // SAFETY: event and stream are handles of this driver.
        let rc = unsafe { (self.drv.cuEventRecord)(event, stream) };
        self.drv.check(rc, "cuEventRecord")
    }

    /// GPU time between two recorded events, ms (waits for the second one).
    // Handles are opaque driver objects, passed through for the driver to validate.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn elapsed_ms(&self, start: Ptr, end: Ptr) -> Result<f64> {
        // SAFETY: end is an event handle of this driver.
        let rc = unsafe { (self.drv.cuEventSynchronize)(end) };
        self.drv.check(rc, "cuEventSynchronize")?;
        let mut ms = 0f32;
        // SAFETY: out-pointer to a local; both events are handles of this driver.
        let rc = unsafe { (self.drv.cuEventElapsedTime)(&mut ms, start, end) };
        self.drv.check(rc, "cuEventElapsedTime")?;
        Ok(ms as f64)
    }

    /// Creates a non-blocking stream (`CU_STREAM_NON_BLOCKING`).
    pub fn new_stream(&self) -> Result<Ptr> {
        let mut s = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        let rc = unsafe { (self.drv.cuStreamCreate)(&mut s, 1) };
        self.drv.check(rc, "cuStreamCreate")?;
        Ok(s)
    }
}

/// Percentile (nearest rank) of a sample, `q` in 0..=100.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// Common options of every client program.
#[derive(clap::Args, Debug, Clone)]
pub struct ResolveArgs {
    /// How to reach the driver: direct (linked; sim-probe-linked only), dlsym, or procaddr
    /// (cuGetProcAddress, as the CUDA runtime does).
    #[arg(long, default_value = "procaddr")]
    pub resolve: String,
    /// cudaVersion passed to cuGetProcAddress (12000, 13000, ...).
    #[arg(long, default_value_t = 12080)]
    pub cuda_version: i32,
    /// Use the per-thread default stream variants (_ptsz / _ptds).
    #[arg(long)]
    pub per_thread: bool,
    /// Device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: i32,
}

impl ResolveArgs {
    /// Resolves the driver as these options say; `direct` fills the table of a binary that links
    /// the driver (required for `--resolve direct`).
    pub fn load(&self, direct: Option<&dyn Fn(bool) -> DirectTable>) -> Result<Driver> {
        let r = Resolve::parse(&self.resolve, self.cuda_version, self.per_thread)?;
        Driver::load(r, direct)
            .with_context(|| format!("resolving the driver via {}", self.resolve))
    }
}
