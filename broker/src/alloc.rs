//! The broker's global allocator. kafka-protocol preallocates every array from the element count
//! a client sends, before reading a single element; a hostile count (found by the frame fuzz
//! test: 2^31 entries) asks for tens of gigabytes, malloc refuses, and Rust aborts the whole
//! process. Large requests are therefore served from lazily committed anonymous mappings: an
//! absurd claim costs address space only until decoding hits the end of the frame and frees it.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};

/// Requests at least this large bypass malloc.
const LARGE: usize = 256 << 20;
const PAGE: usize = 4096;

/// System allocator, with `mmap(MAP_NORESERVE)` for very large blocks.
pub struct BrokerAllocator;

fn is_large(layout: &Layout) -> bool {
    layout.size() >= LARGE && layout.align() <= PAGE
}

unsafe fn map(size: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping has no preconditions; failure returns MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        p.cast()
    }
}

unsafe impl GlobalAlloc for BrokerAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_large(&layout) {
            // SAFETY: size is non-zero (≥ LARGE).
            unsafe { map(layout.size()) }
        } else {
            // SAFETY: forwarded unchanged to the system allocator.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_large(&layout) {
            // SAFETY: fresh anonymous mappings are zero-filled.
            unsafe { map(layout.size()) }
        } else {
            // SAFETY: forwarded unchanged to the system allocator.
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if is_large(&layout) {
            // SAFETY: `ptr` came from `map` with this size (the layout is the one it was made with).
            unsafe { libc::munmap(ptr.cast(), layout.size()) };
        } else {
            // SAFETY: `ptr` came from the system allocator with this layout.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size` with `layout.align()` is a valid layout.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if !is_large(&layout) && !is_large(&new_layout) {
            // SAFETY: both sides belong to the system allocator.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        if is_large(&layout) && is_large(&new_layout) {
            // SAFETY: `ptr` is a mapping of `layout.size()` bytes made by `map`; mremap moves the
            // pages without touching them, so a huge untouched block stays uncommitted.
            let p =
                unsafe { libc::mremap(ptr.cast(), layout.size(), new_size, libc::MREMAP_MAYMOVE) };
            return if p == libc::MAP_FAILED {
                std::ptr::null_mut()
            } else {
                p.cast()
            };
        }
        // One side is below LARGE, so the copy is bounded by it.
        // SAFETY: allocate, copy the common prefix, free the old block; all with matching layouts.
        unsafe {
            let new = self.alloc(new_layout);
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_claims_are_address_space_only() {
        let a = BrokerAllocator;
        let layout = Layout::from_size_align(50usize << 30, 8).unwrap();
        // SAFETY: matching alloc/dealloc with the same layout; only the first page is touched.
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            p.write(7);
            let q = a.realloc(p, layout, 60usize << 30);
            assert_eq!(q.read(), 7);
            a.dealloc(q, Layout::from_size_align(60usize << 30, 8).unwrap());
        }
    }
}
