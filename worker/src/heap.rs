//! The QuickJS heap's allocator: glibc's malloc, metered against the call's memory limit.
//!
//! Why not QuickJS's own limit (`JS_SetMemoryLimit`): it refuses a request before any
//! allocator sees it, and nothing records that it did. When the refusal leaves too little to
//! allocate QuickJS's own "out of memory" error, QuickJS throws a bare `null` instead, which
//! reads as the tool's own `throw null`; and by the time the call is classified the failed
//! request's temporaries are freed, so the heap's size does not tell either. The meter here
//! refuses the request itself and remembers that it did (`Meter::refused`).
//!
//! The meter counts what the allocator hands out, from the runtime's creation on: glibc's
//! usable size of each block, and QuickJS's 4 KiB arenas of small blocks whole, free blocks
//! in them included. So a heap of many small objects, fragmented, counts above its live
//! objects (QuickJS's own count), and the limit binds a little earlier than QuickJS's did. A
//! request is admitted by its size and counted by its usable size, so the count may pass the
//! limit by one block's slack (under 4 KiB).

use std::cell::Cell;
use std::rc::Rc;

/// One runtime's count. The runtime and the call's engine share it.
#[derive(Default)]
pub struct Meter {
    /// Bytes the runtime holds now.
    used: Cell<usize>,
    /// The most it may hold; 0 is no limit (a runtime not yet given a call's limits).
    limit: Cell<usize>,
    /// A request was refused (over the limit, or glibc had none) since the last `set_limit`.
    refused: Cell<bool>,
}

impl Meter {
    /// The call's limit, and a clean slate for `refused`.
    pub fn set_limit(&self, bytes: usize) {
        self.limit.set(bytes);
        self.refused.set(false);
    }

    /// Whether a request was refused since the limit was set: a failure that surfaced as
    /// QuickJS's out-of-memory error, or as the `null` it throws when it cannot make one,
    /// is the memory limit's.
    pub fn refused(&self) -> bool {
        self.refused.get()
    }

    /// Room for `more` bytes, else the refusal is recorded.
    fn admit(&self, more: usize) -> bool {
        let limit = self.limit.get();
        let ok = limit == 0 || self.used.get().saturating_add(more) <= limit;
        if !ok {
            self.refused.set(true);
        }
        ok
    }

    /// Counts a block glibc handed out (or records that it had none).
    fn took(&self, ptr: *mut u8) -> *mut u8 {
        if ptr.is_null() {
            self.refused.set(true);
        } else {
            self.used.set(self.used.get() + usable(ptr));
        }
        ptr
    }
}

fn usable(ptr: *mut u8) -> usize {
    // SAFETY: `ptr` is a live block from glibc's malloc, calloc or realloc.
    unsafe { libc::malloc_usable_size(ptr.cast()) }
}

/// The allocator a runtime is made with (`rquickjs::Runtime::new_with_alloc`).
pub struct Metered(pub Rc<Meter>);

// SAFETY: every block comes from glibc's malloc family, which aligns to 16 bytes (at least
// `usize`'s alignment), and `usable_size` is glibc's for the same blocks.
unsafe impl rquickjs::allocator::Allocator for Metered {
    fn alloc(&mut self, size: usize) -> *mut u8 {
        if !self.0.admit(size) {
            return std::ptr::null_mut();
        }
        // SAFETY: plain malloc; a null return is handled by the caller (QuickJS).
        self.0.took(unsafe { libc::malloc(size) }.cast())
    }

    fn calloc(&mut self, count: usize, size: usize) -> *mut u8 {
        let Some(total) = count.checked_mul(size) else {
            self.0.refused.set(true);
            return std::ptr::null_mut();
        };
        if !self.0.admit(total) {
            return std::ptr::null_mut();
        }
        // SAFETY: plain calloc.
        self.0.took(unsafe { libc::calloc(count, size) }.cast())
    }

    unsafe fn dealloc(&mut self, ptr: *mut u8) {
        let m = &self.0;
        m.used.set(m.used.get().saturating_sub(usable(ptr)));
        // SAFETY: the caller hands back a block this allocator gave out.
        unsafe { libc::free(ptr.cast()) }
    }

    unsafe fn realloc(&mut self, ptr: *mut u8, new_size: usize) -> *mut u8 {
        if ptr.is_null() {
            return self.alloc(new_size);
        }
        if new_size == 0 {
            // What glibc's realloc does with 0 (QuickJS never asks it): a free.
            // SAFETY: the caller hands back a block this allocator gave out.
            unsafe { self.dealloc(ptr) };
            return std::ptr::null_mut();
        }
        let old = usable(ptr);
        if new_size > old && !self.0.admit(new_size - old) {
            return std::ptr::null_mut();
        }
        // SAFETY: `ptr` is this allocator's block; on failure glibc leaves it as it was.
        let new = unsafe { libc::realloc(ptr.cast(), new_size) }.cast::<u8>();
        if new.is_null() {
            self.0.refused.set(true);
            return new;
        }
        let m = &self.0;
        m.used.set(m.used.get().saturating_sub(old) + usable(new));
        new
    }

    unsafe fn usable_size(ptr: *mut u8) -> usize {
        usable(ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rquickjs::{Context, Runtime, Value};

    fn metered() -> (Runtime, Rc<Meter>) {
        let meter = Rc::new(Meter::default());
        let rt = Runtime::new_with_alloc(Metered(meter.clone())).unwrap_or_else(|e| panic!("{e}"));
        (rt, meter)
    }

    /// The count follows what the runtime holds: it grows with what a script keeps and
    /// falls back when that is let go.
    #[test]
    fn the_meter_counts_what_the_runtime_holds() {
        let (rt, meter) = metered();
        let ctx = Context::full(&rt).unwrap_or_else(|e| panic!("{e}"));
        let base = meter.used.get();
        ctx.with(|ctx| {
            let _: Value = ctx
                .eval("globalThis.keep = new Array(1e6).fill(1.5)")
                .unwrap_or_else(|e| panic!("{e}"));
        });
        let full = meter.used.get();
        assert!(full > base + 8_000_000, "{base} -> {full}");
        ctx.with(|ctx| {
            let _: Value = ctx
                .eval("globalThis.keep = null")
                .unwrap_or_else(|e| panic!("{e}"));
        });
        rt.run_gc();
        assert!(meter.used.get() < base + 1_000_000, "{}", meter.used.get());
        assert!(!meter.refused());
    }

    /// Over the limit, the request is refused and the refusal is remembered until the next
    /// limit is set; the script sees QuickJS's out-of-memory error (or its `null`).
    #[test]
    fn a_request_over_the_limit_is_refused_and_remembered() {
        let (rt, meter) = metered();
        let ctx = Context::full(&rt).unwrap_or_else(|e| panic!("{e}"));
        meter.set_limit(meter.used.get() + 4_000_000);
        let caught = ctx.with(|ctx| {
            ctx.eval::<Value, _>("new Array(1e6).fill(1.5).length")
                .is_err()
        });
        assert!(caught);
        assert!(meter.refused());
        assert!(meter.used.get() <= meter.limit.get() + 4096);
        meter.set_limit(0);
        assert!(!meter.refused());
        let n = ctx.with(|ctx| ctx.eval::<i32, _>("new Array(1e6).fill(1.5).length"));
        assert_eq!(n.ok(), Some(1_000_000));
    }
}
