//! `take_free_chunks`, as the zygote calls it: on the main thread of a single-threaded process
//! whose heap has free chunks scattered through it. Afterwards no free chunk is left in glibc's
//! bins, and new allocations (a worker's, after a fork) come from above everything allocated
//! before, not from the holes.

fn main() {
    #[repr(C)]
    #[allow(dead_code)]
    struct Mallinfo2 {
        fields: [usize; 8],
        fordblks: usize,
        keepcost: usize,
    }
    extern "C" {
        fn mallinfo2() -> Mallinfo2;
    }
    // A heap with holes of many sizes, as a context's making leaves the zygote's.
    let blocks: Vec<usize> = (0..20_000usize)
        // SAFETY: plain allocations, freed below or kept until the process ends.
        .map(|i| unsafe { libc::malloc(16 + (i * 37) % 900) } as usize)
        .collect();
    for (i, &p) in blocks.iter().enumerate() {
        if i % 3 != 0 {
            // SAFETY: allocated above, freed once.
            unsafe { libc::free(p as *mut libc::c_void) };
        }
    }
    let highest = blocks.iter().copied().max().unwrap_or(0);
    // SAFETY: mallinfo2 only reads the allocator's state.
    let before = unsafe { mallinfo2() };
    assert!(
        before.fordblks > before.keepcost,
        "the heap has no free chunk to take: the test proves nothing"
    );
    let taken = stsd_worker::take_free_chunks();
    // SAFETY: as above.
    let after = unsafe { mallinfo2() };
    assert!(taken > 0, "nothing was taken");
    assert_eq!(
        after.fordblks - after.keepcost,
        0,
        "free bytes left in the bins ({taken} chunks taken)"
    );
    for size in [24, 48, 100, 300, 700, 2000] {
        // SAFETY: plain allocations, never freed.
        let p = unsafe { libc::malloc(size) } as usize;
        assert!(
            p > highest,
            "a {size}-byte allocation landed in a hole at {p:#x}, below {highest:#x}"
        );
    }
    println!("free_chunks: {taken} chunks taken, new allocations above the old heap");
}
