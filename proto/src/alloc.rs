//! The allocator every Shoal process runs on: mimalloc, entered by its plain `mi_malloc` for
//! the alignments that call guarantees.
//!
//! Every node allocates a row, a message or a key per request; glibc's malloc took a fifth of
//! the CPU under load (perf), mimalloc's thread-local free lists much less. The `mimalloc`
//! crate's allocator enters mimalloc by `mi_malloc_aligned` for every allocation, whose check
//! for a free block that happens to have the alignment asked for is a call and a dozen
//! instructions more than `mi_malloc`'s inlined fast path. Every mimalloc block is aligned to
//! at least a machine word, so allocations asking for no more than that take `mi_malloc`.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment every block `mi_malloc` hands out has (`MI_INTPTR_SIZE`).
const WORD: usize = std::mem::size_of::<usize>();

pub struct Allocator;

/// A block for `layout` from mimalloc's plain entry point when a word's alignment is enough,
/// else from its aligned one.
///
/// # Safety
/// `plain` and `aligned` are a pair of mimalloc's allocating entry points (a size; a size and
/// an alignment).
#[inline]
unsafe fn enter(
    layout: Layout,
    plain: unsafe extern "C" fn(usize) -> *mut c_void,
    aligned: unsafe extern "C" fn(usize, usize) -> *mut c_void,
) -> *mut u8 {
    // SAFETY: the caller passes mimalloc's entry points; each takes any size, and the aligned
    // one any power-of-two alignment (which a `Layout` has).
    unsafe {
        match layout.align() <= WORD {
            true => plain(layout.size()),
            false => aligned(layout.size(), layout.align()),
        }
    }
    .cast()
}

// SAFETY: each call hands mimalloc's answer on as it is (null on failure); blocks are freed
// by `mi_free`, whichever entry point allocated them; the aligned entry points serve every
// alignment past a word, the plain ones only alignments a block always has.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: a pair of mimalloc's entry points.
        unsafe { enter(layout, mi::mi_malloc, mi::mi_malloc_aligned) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: a pair of mimalloc's entry points.
        unsafe { enter(layout, mi::mi_zalloc, mi::mi_zalloc_aligned) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (GlobalAlloc's contract).
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`, so from the plain entry points
        // exactly when the plain realloc may take it over.
        unsafe {
            match layout.align() <= WORD {
                true => mi::mi_realloc(ptr.cast(), new_size),
                false => mi::mi_realloc_aligned(ptr.cast(), new_size, layout.align()),
            }
        }
        .cast()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_have_the_alignment_asked_for_and_keep_their_bytes() {
        let a = Allocator;
        for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
            for size in [1, 3, 8, 12, 24, 40, 100, 1000, 70_000] {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero size; every block is freed with its layout.
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null() && (p as usize).is_multiple_of(align), "size {size} align {align}");
                    p.write_bytes(0xab, size);
                    let q = a.realloc(p, layout, size * 3);
                    assert!((q as usize).is_multiple_of(align), "grown: size {size} align {align}");
                    assert!(std::slice::from_raw_parts(q, size).iter().all(|&b| b == 0xab));
                    a.dealloc(q, Layout::from_size_align(size * 3, align).unwrap());
                    let z = a.alloc_zeroed(layout);
                    assert!(
                        (z as usize).is_multiple_of(align)
                            && std::slice::from_raw_parts(z, size).iter().all(|&b| b == 0)
                    );
                    a.dealloc(z, layout);
                }
            }
        }
    }
}
