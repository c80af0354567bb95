//! Regenerates `kernels/advantage.ptx` from `kernels/advantage.cu` with NVRTC
//! (compute_90, for Hopper). Needs libnvrtc 13.0.x on LD_LIBRARY_PATH, for
//! example from PyPI `nvidia-cuda-nvrtc==13.0.88` (`nvidia/cu13/lib`); no GPU
//! and no CUDA toolkit are needed.
//!
//!     cargo run --example gen_ptx --features cuda

#[cfg(feature = "cuda")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let src = std::fs::read_to_string(dir.join("advantage.cu"))?;
    let options = CompileOptions {
        arch: Some("compute_90"),
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(src, options)?;
    std::fs::write(dir.join("advantage.ptx"), ptx.to_src())?;
    println!("wrote {}", dir.join("advantage.ptx").display());
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("build with --features cuda");
    std::process::exit(2);
}
