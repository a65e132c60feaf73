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
        .map(|i| unsafe { libc::malloc(16 + (i * 37) % 1100) } as usize)
        .collect();
    for (i, &p) in blocks.iter().enumerate() {
        if i % 3 != 0 {
            // SAFETY: allocated above, freed once.
            unsafe { libc::free(p as *mut libc::c_void) };
        }
    }
    // The highest block still allocated (a freed one may have merged into the top).
    let highest = blocks.iter().step_by(3).copied().max().unwrap_or(0);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let heap_start = maps
        .lines()
        .find(|l| l.ends_with("[heap]"))
        .and_then(|l| l.split('-').next())
        .and_then(|a| usize::from_str_radix(a, 16).ok());
    assert!(heap_start.is_some(), "no [heap] mapping:\n{maps}");
    // SAFETY: mallinfo2 only reads the allocator's state.
    let before = unsafe { mallinfo2() };
    assert!(
        before.fordblks > before.keepcost,
        "the heap has no free chunk to take: the test proves nothing"
    );
    let taken = stsd_worker::take_free_chunks(heap_start);
    // SAFETY: as above.
    let after = unsafe { mallinfo2() };
    assert!(taken > 0, "nothing was taken");
    assert_eq!(
        after.fordblks - after.keepcost,
        0,
        "free bytes left in the bins ({taken} chunks taken)"
    );
    // Every size the thread's cache and the small bins serve (which mallinfo2 does not count
    // for the cache), and a large one.
    for size in (8..=1032).step_by(8).chain([2000, 5000]) {
        // SAFETY: plain allocations, never freed.
        let p = unsafe { libc::malloc(size) } as usize;
        assert!(
            p > highest,
            "a {size}-byte allocation landed in a hole at {p:#x}, below {highest:#x}"
        );
    }
    // Chunks in the thread's cache only (glibc's count does not see them): 1 KiB blocks freed
    // between kept ones, with nothing left in the bins.
    let pairs: Vec<(usize, usize)> = (0..7)
        // SAFETY: plain allocations; the first of each pair is freed below, the second kept.
        .map(|_| unsafe { (libc::malloc(1024) as usize, libc::malloc(64) as usize) })
        .collect();
    let kept_top = pairs.iter().map(|p| p.1).max().unwrap_or(0);
    for &(p, _) in &pairs {
        // SAFETY: allocated above, freed once.
        unsafe { libc::free(p as *mut libc::c_void) };
    }
    stsd_worker::take_free_chunks(heap_start);
    // SAFETY: a plain allocation, never freed.
    let p = unsafe { libc::malloc(1024) } as usize;
    assert!(
        p > kept_top,
        "a 1 KiB block came from the thread's cache at {p:#x}, below {kept_top:#x}"
    );
    println!("free_chunks: {taken} chunks taken, new allocations above the old heap");
}
