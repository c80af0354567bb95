//! The binary's allocators: jemalloc for Rust's heap, with the options a
//! stage's repeating steps want, and the options of glibc's malloc, which
//! librdkafka (a C library) uses for its buffers.
//!
//! A 1M-row step of stage 2 allocates a few hundred MB (its messages, its
//! columns, its advantages, its chunks) and frees them once it is
//! published; the next step does it again. Every page the system takes back
//! in between costs a page fault when it is touched again (measured with
//! `perf record -g`: a quarter of the worker's CPU for a step, in the
//! kernel's `do_anonymous_page`). jemalloc's options (`malloc_conf` in
//! `src/main.rs`), [`ZeroByWriting`] and [`tune_glibc_malloc`] keep a step's
//! pages for the next one: 55,000-60,000 faults a 1M-row step before, about
//! 5,000 after (docs/BENCHMARKS.md, "Round eighteen").

use std::alloc::{GlobalAlloc, Layout};

/// Sizes from which a zeroed allocation is zeroed by writing zeros
/// ([`ZeroByWriting`]): jemalloc's "large" blocks. Smaller ones come from
/// its slabs (up to 14 KiB), which it zeroes by writing itself.
const WRITE_ZEROS_FROM: usize = 16 * 1024;

/// jemalloc, whose zeroed allocations of [`WRITE_ZEROS_FROM`] bytes and more
/// are written with zeros here. jemalloc zeroes a reused large block (past
/// its thread cache's 32 KiB) by handing its pages back to the system
/// (`MADV_DONTNEED`) so that they come back zeroed, which faults every page
/// in again: a 1M-row step's three advantage columns (`vec![0.0; n]`,
/// 24 MB, about 5,900 pages) were faulted in again at every step (the
/// kernel's `fill` in the profile). Writing the zeros touches pages that are
/// resident already.
///
/// The cost: jemalloc skips the zeroing of pages fresh from the system
/// (they are zero), and this writes them all the same. They are faulted in
/// by the writing instead of by their first use, and become resident at
/// once: a zeroed block used only in part takes its whole size in memory.
pub struct ZeroByWriting<A>(pub A);

// SAFETY: every call is `A`'s, with the same layout; `alloc_zeroed` returns
// what `A::alloc` returned, its `layout.size()` bytes written with zeros
// first, as `alloc_zeroed` must.
unsafe impl<A: GlobalAlloc> GlobalAlloc for ZeroByWriting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.0.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() < WRITE_ZEROS_FROM {
            return self.0.alloc_zeroed(layout);
        }
        let block = self.0.alloc(layout);
        if !block.is_null() {
            std::ptr::write_bytes(block, 0, layout.size());
        }
        block
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        self.0.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.0.realloc(ptr, layout, new_size)
    }
}

/// glibc malloc's options for librdkafka's buffers (a fetched batch, a copy
/// of each produced message): blocks up to 32 MiB come from its heaps, and
/// the main heap keeps up to 256 MiB of free memory at its top. By default
/// both thresholds start low (128 KiB) and only rise, to the largest mapped
/// block freed (the trim threshold to twice that), so a step's buffers went
/// back to the system between steps until they did. The other heaps (at
/// most 64 MiB each, one per thread that allocates, up to 8 a core) are
/// then never trimmed at their top, only unmapped when empty: glibc keeps
/// at most each one's peak. Called first thing in `main`, before
/// librdkafka starts a thread (`mallopt` is not thread-safe).
#[cfg(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64"))]
pub fn tune_glibc_malloc() {
    const MMAP_THRESHOLD: libc::c_int = 32 * 1024 * 1024;
    const TRIM_THRESHOLD: libc::c_int = 256 * 1024 * 1024;
    // SAFETY: mallopt only sets malloc's parameters; no other thread runs
    // yet.
    let (mmap, trim) = unsafe {
        (
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        )
    };
    // Both within glibc's limits on 64-bit; should it refuse one anyway,
    // that threshold keeps its default.
    debug_assert_eq!((mmap, trim), (1, 1), "glibc refused a malloc threshold");
}

/// Elsewhere the system's malloc keeps its defaults.
#[cfg(not(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64")))]
pub fn tune_glibc_malloc() {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::System;

    /// Writes `byte` over a fresh block of `layout` from `a`, frees it,
    /// then asks for a zeroed block of the same layout: the allocator
    /// reuses the freed memory for it (same size, no other thread in
    /// between).
    fn zeroed_after_reuse<A: GlobalAlloc>(a: &ZeroByWriting<A>, layout: Layout, byte: u8) -> Vec<u8> {
        unsafe {
            let dirty = a.alloc(layout);
            assert!(!dirty.is_null());
            std::ptr::write_bytes(dirty, byte, layout.size());
            a.dealloc(dirty, layout);
            let zeroed = a.alloc_zeroed(layout);
            assert!(!zeroed.is_null());
            let bytes = std::slice::from_raw_parts(zeroed, layout.size()).to_vec();
            a.dealloc(zeroed, layout);
            bytes
        }
    }

    #[test]
    fn a_zeroed_block_is_zeroed_whatever_its_size_and_memory_before() {
        for size in [1, 4096, WRITE_ZEROS_FROM - 1, WRITE_ZEROS_FROM, 1 << 20, 24 << 20] {
            let layout = Layout::from_size_align(size, 64).expect("a layout");
            let bytes = zeroed_after_reuse(&ZeroByWriting(System), layout, 0xAB);
            assert!(bytes.iter().all(|&b| b == 0), "size {size}");
        }
    }

    /// Over jemalloc, the binary's allocator: a large block freed dirty and
    /// asked for again zeroed.
    #[cfg(not(target_env = "msvc"))]
    #[test]
    fn over_jemalloc_a_reused_large_block_comes_back_zeroed() {
        let a = ZeroByWriting(tikv_jemallocator::Jemalloc);
        for size in [WRITE_ZEROS_FROM, 1 << 20, 24 << 20] {
            let layout = Layout::from_size_align(size, 8).expect("a layout");
            let bytes = zeroed_after_reuse(&a, layout, 0xEF);
            assert!(bytes.iter().all(|&b| b == 0), "size {size}");
        }
    }

    /// The wrapper over an allocator that returns garbage for `alloc`:
    /// only its own writing zeroes a large block.
    struct Garbage;

    unsafe impl GlobalAlloc for Garbage {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let p = System.alloc(layout);
            std::ptr::write_bytes(p, 0xCD, layout.size());
            p
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            System.dealloc(ptr, layout)
        }
    }

    #[test]
    fn a_large_zeroed_block_is_written_with_zeros_by_the_wrapper() {
        let a = ZeroByWriting(Garbage);
        let layout = Layout::from_size_align(WRITE_ZEROS_FROM * 3, 8).expect("a layout");
        unsafe {
            let p = a.alloc_zeroed(layout);
            let bytes = std::slice::from_raw_parts(p, layout.size());
            assert!(bytes.iter().all(|&b| b == 0));
            a.dealloc(p, layout);
        }
    }
}
