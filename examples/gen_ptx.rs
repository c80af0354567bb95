//! Regenerates `kernels/advantage.ptx` from `kernels/advantage.cu` with NVRTC
//! for `compute_70`, so that every GPU from Volta (sm_70) through Turing,
//! Ampere, Ada and Hopper JITs the same PTX.
//!
//! The PTX must also load on CUDA 12.0 drivers, which accept PTX ISA 8.0 and
//! older. NVRTC writes its own ISA version into the header (NVRTC 13 writes
//! 9.0 and has no option for an older one), so this needs NVRTC 12.0: PyPI's
//! `nvidia-cuda-nvrtc-cu12==12.0.*` (libnvrtc.so.12, no GPU and no CUDA
//! toolkit needed). It refuses to write PTX whose `.version` is above 8.0 or
//! whose `.target` is not sm_70.
//!
//!     python3 -m venv /tmp/nvrtc12
//!     /tmp/nvrtc12/bin/pip install 'nvidia-cuda-nvrtc-cu12==12.0.*'
//!     LD_LIBRARY_PATH=/tmp/nvrtc12/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib \
//!         cargo run --example gen_ptx --features cuda

/// The newest PTX ISA that CUDA 12.0 drivers load.
#[cfg(feature = "cuda")]
const MAX_PTX_ISA: (u32, u32) = (8, 0);

#[cfg(feature = "cuda")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints and reads nothing.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }.result()?;
    println!("NVRTC {major}.{minor}");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let src = std::fs::read_to_string(dir.join("advantage.cu"))?;
    let options = CompileOptions {
        arch: Some("compute_70"),
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(src, options)?.to_src();
    let header = |key: &str| {
        ptx.lines()
            .find_map(|l| l.trim().strip_prefix(key).map(|v| v.trim().to_string()))
            .unwrap_or_default()
    };
    let version = header(".version");
    let isa = version
        .split_once('.')
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
        .ok_or_else(|| format!("no `.version` in the PTX (found {version:?})"))?;
    if isa > MAX_PTX_ISA {
        return Err(format!(
            "NVRTC {major}.{minor} wrote PTX ISA {version}, which CUDA 12.0 drivers reject; \
             use NVRTC 12.0 (see this file's docs)"
        )
        .into());
    }
    let target = header(".target");
    if target != "sm_70" {
        return Err(format!("PTX targets {target:?}, not sm_70").into());
    }
    std::fs::write(dir.join("advantage.ptx"), &ptx)?;
    println!(
        "wrote {} (PTX ISA {version}, {target})",
        dir.join("advantage.ptx").display()
    );
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("build with --features cuda");
    std::process::exit(2);
}
