//! What a forked worker inherits ready to use, so that its call does not pay for first
//! touches. On a VM a page fault costs a few microseconds, and a worker forked from the
//! zygote used to take about 90 of them inside its call (`stsd run --timings` counts them):
//! its code is file-backed, and fork(2) does not copy a file-backed mapping's page-table
//! entries (the child faults them in again); and every heap page it writes is shared with the
//! zygote, so the first write copies it.
//!
//! Both are set up by [`prepare`] (the zygote, once) and [`own_heap_while_idle`] (each worker).
//!
//! And what a worker should *not* inherit as page-table entries: [`clean_relro`] (the zygote,
//! first thing). The dynamic loader writes the relocated pointers of every read-only-after-
//! relocation region (RELRO: vtables, the GOT, tables of pointers; 1.6 MiB in stsd), so each
//! of its pages is a private anonymous page, and fork copies every one of their entries into
//! every worker, which clears them again at exit (about 0.15 µs an entry on this VM,
//! `scripts/machine_costs.c`), whether it reads the page or not. Nor, one by one, those of
//! stsd's code: [`huge_code`] (the zygote, second) puts every 2 MiB block of it in a huge page
//! (the last one padded with zeros where the loader left the rest of it unmapped), which a
//! worker maps with one entry when it first runs it.
//!
//! - The rest of the code (the zygote, once, in [`prepare`]): each other private code mapping
//!   (a block that could not be made huge, a dynamically linked build's libraries) gets one
//!   anonymous page of its own,
//!   which makes fork copy the mapping's page-table entries (the kernel copies them for every
//!   mapping that has anonymous pages). What is copied is what the zygote itself ran while it
//!   started and made the first context: entries pointing at pages the page cache already
//!   holds, no new memory.
//! - [`own_heap_while_idle`] (each forked worker, after Ready, until work comes): makes its
//!   own copy of every heap page (`MADV_POPULATE_WRITE`, a chunk at a time), so the copies
//!   are made while nobody waits rather than inside the call.
//!
//! None of these changes what a worker can do or see: the same bytes at the same addresses, with
//! the same protections, before any job exists.

use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// One line of /proc/self/maps that matters here.
struct Mapping {
    start: usize,
    end: usize,
    perms: [u8; 4],
    path: String,
}

fn mappings() -> Vec<Mapping> {
    let Ok(text) = fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (range, perms) = (f.next()?, f.next()?);
            let path = f.nth(3).unwrap_or("").to_string();
            let (a, b) = range.split_once('-')?;
            let perms: [u8; 4] = perms.as_bytes().try_into().ok()?;
            Some(Mapping {
                start: usize::from_str_radix(a, 16).ok()?,
                end: usize::from_str_radix(b, 16).ok()?,
                perms,
                path,
            })
        })
        .collect()
}

/// The zygote, before anything else: each RELRO region of stsd and of its libraries is
/// replaced, at its address, by a read-only private mapping of a sealed memfd holding the same
/// bytes. The region's pages are then file pages, not anonymous ones: fork copies none of
/// their entries, and a worker maps (a fault, with its neighbours) only what it reads. The
/// bytes, the addresses and the protection are unchanged, and nothing can write the memfd
/// (sealed against writes, growing and shrinking, and closed). A region that cannot be
/// copied is left as it was.
pub fn clean_relro() {
    let maps = mappings();
    for (start, len) in relro_regions() {
        // Only what the kernel lists as a read-only private mapping of a file, whole: never
        // the vDSO, never a range the loader did not make read-only.
        let whole = maps.iter().any(|m| {
            &m.perms == b"r--p"
                && m.path.starts_with('/')
                && m.start <= start
                && start + len <= m.end
        });
        if !whole {
            continue;
        }
        // SAFETY: [start, start + len) is a whole RELRO region as the loader protected it
        // (page-aligned, read-only, holding no code); it is read while nothing writes it
        // (this process is single-threaded and nothing writes a RELRO region), and replaced
        // by a mapping of the same bytes at the same address with the same protection.
        unsafe { replace_with_memfd(start, len) };
    }
}

/// Size of a huge page, the unit of [`huge_code`] (x86-64 and arm64 with 4 KiB pages).
const HUGE: usize = 2 << 20;
/// The name [`huge_code`] gives its memfds, and how /proc/self/maps names their mappings (for
/// [`prepare`]).
const HUGE_CODE_NAME: &std::ffi::CStr = c"stsd-code";
const HUGE_CODE_MAPPING: &str = "/memfd:stsd-code";

/// The zygote, second: the code of stsd that lies in 2 MiB-aligned blocks (the last one
/// padded, see [`padded_end`]) is replaced, at its address, by a read-only private mapping of
/// a sealed memfd holding the same bytes in huge pages (`MADV_COLLAPSE`). A worker then maps each block its call runs with one fault
/// and one page-table entry, instead of inheriting an entry per 4 KiB page of code the zygote
/// ran (fork copied about 1200 of them into every worker, and exit cleared them again: some
/// 300 µs of CPU per one-shot call here). The bytes, the addresses and the protection are
/// unchanged, and nothing can write the memfd. Where huge pages cannot be made (a kernel
/// without `MADV_COLLAPSE` for shared memory, or `shmem_enabled` set to `deny`) nothing is
/// replaced.
///
/// `given` is the memfd an earlier zygote made (the supervisor keeps it and hands it to each
/// zygote it execs): the code of the same binary, already in huge pages, so that a new zygote
/// maps it instead of copying 18 MiB and collapsing it again (13 to 16 ms here). It is
/// used only if it is sealed against every change and has the size of the code it replaces
/// (the code of a PIE is the same bytes wherever it is loaded). Returns the memfd of the
/// largest code mapping this zygote replaced with one it made itself, for the supervisor to
/// keep (None when it mapped the one it was given).
pub fn huge_code(mut given: Option<OwnedFd>) -> Option<OwnedFd> {
    let mut kept: Option<(usize, OwnedFd)> = None;
    let maps = mappings();
    for m in &maps {
        if &m.perms != b"r-xp" || !m.path.starts_with('/') {
            continue;
        }
        let from = (m.start + HUGE - 1) & !(HUGE - 1);
        let mut to = padded_end(m, &maps);
        // The gap the last block is padded into is held (no access) until that block is
        // mapped over it, so that nothing mapped meanwhile (the scratch mapping) can land
        // there; if its block cannot be made huge, the gap stays held, inaccessible as before.
        if to > m.end && !hold_gap(m.end, to - m.end) {
            to = m.end & !(HUGE - 1);
        }
        if to <= from {
            continue;
        }
        let len = to - from;
        let (fd, made) = match given.take_if(|fd| sealed_of_size(fd, len)) {
            Some(fd) => (fd, false),
            None => match copy_to_memfd(from, m.end.min(to) - from, len) {
                Some(fd) => (fd, true),
                None => continue,
            },
        };
        // SAFETY: [from, to) lies inside one executable private mapping of a file, as the
        // kernel listed it, or runs past its end only into addresses nothing maps (see
        // padded_end); `fd` holds its bytes, then zeros; this process is single-threaded
        // and nothing writes code.
        let mapped = unsafe { map_huge(from, len, &fd) };
        if mapped && made && kept.as_ref().is_none_or(|k| k.0 < len) {
            kept = Some((len, fd));
        }
    }
    kept.map(|k| k.1)
}

/// Where `m`'s huge-page code ends: its last whole 2 MiB block; or, when nothing is mapped
/// between its end and the end of the block it ends in, that block too, its rest zeros. The
/// code's last partial block was otherwise mapped a 4 KiB page at a time (in the static
/// executable 1.1 MiB: about 280 page-table entries that every fork copied and every exit
/// cleared); the padding adds no instruction, and lies where the loader left a gap.
fn padded_end(m: &Mapping, maps: &[Mapping]) -> usize {
    let whole = m.end & !(HUGE - 1);
    let padded = (m.end + HUGE - 1) & !(HUGE - 1);
    let gap_free = !maps.iter().any(|o| o.start < padded && o.end > m.end);
    if padded > whole && gap_free {
        padded
    } else {
        whole
    }
}

/// Maps `[at, at + len)` with no access, only where nothing is mapped (`MAP_FIXED_NOREPLACE`):
/// whether it is now held.
fn hold_gap(at: usize, len: usize) -> bool {
    // SAFETY: a new anonymous mapping that replaces nothing (the kernel refuses the range if
    // any of it is mapped).
    let got = unsafe {
        libc::mmap(
            at as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_NORESERVE
                | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if got == at as *mut libc::c_void {
        return true;
    }
    if got != libc::MAP_FAILED {
        // A kernel before 4.17 took the address as a hint: give back what it mapped elsewhere.
        // SAFETY: the mapping just made, nothing else.
        unsafe { libc::munmap(got, len) };
    }
    false
}

/// Seals that make a memfd's bytes final.
const FINAL: libc::c_int =
    libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;

/// Whether `fd` is a memfd sealed with [`FINAL`] holding exactly `len` bytes.
fn sealed_of_size(fd: &OwnedFd, len: usize) -> bool {
    // SAFETY: fcntl and fstat on a descriptor we own, into a stat we own.
    unsafe {
        let seals = libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS);
        let mut st: libc::stat = std::mem::zeroed();
        seals >= 0
            && seals & FINAL == FINAL
            && libc::fstat(fd.as_raw_fd(), &mut st) == 0
            && st.st_size as usize == len
    }
}

/// A sealed memfd of `size` bytes: `[start, start + len)` of this process's (readable) code,
/// then zeros.
fn copy_to_memfd(start: usize, len: usize, size: usize) -> Option<OwnedFd> {
    const MFD_EXEC: libc::c_uint = 0x10; // Linux 6.3: executable even where memfd_noexec=1
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: memfd_create with a NUL-terminated name; the descriptor is owned at once.
    let fd = unsafe {
        let mut fd = libc::memfd_create(HUGE_CODE_NAME.as_ptr(), flags | MFD_EXEC);
        if fd < 0 {
            fd = libc::memfd_create(HUGE_CODE_NAME.as_ptr(), flags); // before 6.3 every memfd is
        }
        if fd < 0 {
            return None;
        }
        OwnedFd::from_raw_fd(fd)
    };
    // SAFETY: the caller's range is mapped readable.
    let copied = unsafe { write_all(fd.as_raw_fd(), start, len) }
        // SAFETY: ftruncate on a descriptor we own (the rest reads as zeros).
        && unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } == 0;
    // SAFETY: fcntl on a descriptor we own.
    let sealed = copied && unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, FINAL) } == 0;
    sealed.then_some(fd)
}

/// Maps `fd`'s huge pages over `[start, start + len)`; whether any block was replaced.
///
/// # Safety
/// `[start, start + len)` must be 2 MiB-aligned, inside one mapping of read-only executable
/// code that nothing writes (or past its end only where nothing is mapped), in a
/// single-threaded process, and `fd` must hold its bytes (zeros past the code's end).
unsafe fn map_huge(start: usize, len: usize, fd: &OwnedFd) -> bool {
    // Linux 6.1.
    const MADV_COLLAPSE: libc::c_int = 25;
    // The memfd's pages become huge ones (in its page cache, which every mapping of it shares)
    // through a scratch mapping at an aligned address, a block at a time (a memfd an earlier
    // zygote made is huge already: then this only checks it); only a block that became one
    // replaces the code at its address (a block that could not, for want of a free 2 MiB of
    // memory say, stays as it was).
    let Some(scratch) = Scratch::map(fd.as_raw_fd(), len) else {
        return false;
    };
    let mut replaced = false;
    let mut off = 0;
    while off < len {
        if scratch.collapse(off, MADV_COLLAPSE) {
            let at = start + off;
            // SAFETY: the caller's: the same bytes at the same address with the same
            // protection. The code running here may lie in the block: it stays mapped and
            // executable, and its bytes never change.
            let mapped = unsafe {
                libc::mmap(
                    at as *mut libc::c_void,
                    HUGE,
                    libc::PROT_READ | libc::PROT_EXEC,
                    libc::MAP_PRIVATE | libc::MAP_FIXED,
                    fd.as_raw_fd(),
                    off as libc::off_t,
                )
            };
            if mapped != at as *mut libc::c_void {
                // The old mapping may be gone: this process cannot go on (as in
                // replace_with_memfd).
                // SAFETY: _exit ends the process.
                unsafe { libc::_exit(70) };
            }
            replaced = true;
        }
        off += HUGE;
    }
    replaced
}

/// A memfd mapped shared, read-only and executable, at a 2 MiB-aligned address of its own
/// (so that the mapping the code gets is known to be allowed before it replaces anything).
struct Scratch {
    reserved: *mut libc::c_void,
    span: usize,
    at: usize,
}

impl Scratch {
    fn map(fd: i32, len: usize) -> Option<Scratch> {
        let span = len + HUGE;
        // SAFETY: a fresh reservation of this process's own, then the memfd mapped over its
        // aligned part (its seals allow a mapping that cannot write).
        unsafe {
            let reserved = libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            );
            if reserved == libc::MAP_FAILED {
                return None;
            }
            let scratch = Scratch {
                reserved,
                span,
                at: (reserved as usize + HUGE - 1) & !(HUGE - 1),
            };
            let at = libc::mmap(
                scratch.at as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd,
                0,
            );
            (at == scratch.at as *mut libc::c_void).then_some(scratch)
        }
    }

    /// Makes the block at `off` one huge page; false when the kernel cannot. EAGAIN is the
    /// kernel's transient failure (a lock on the pages it could not take, as when several
    /// zygotes start at once): asked again, a few times.
    fn collapse(&self, off: usize, madv_collapse: libc::c_int) -> bool {
        for _ in 0..4 {
            // SAFETY: the block lies in this scratch mapping.
            let rc =
                unsafe { libc::madvise((self.at + off) as *mut libc::c_void, HUGE, madv_collapse) };
            if rc == 0 {
                return true;
            }
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EAGAIN) {
                return false;
            }
        }
        false
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: the reservation this value made; nothing points into it.
        unsafe { libc::munmap(self.reserved, self.span) };
    }
}

/// Writes `[start, start + len)` of this process's memory to `fd`.
///
/// # Safety
/// The range must be mapped readable.
unsafe fn write_all(fd: i32, start: usize, len: usize) -> bool {
    let mut done = 0usize;
    while done < len {
        // SAFETY: the caller's range.
        let n = unsafe { libc::write(fd, (start + done) as *const libc::c_void, len - done) };
        if n <= 0 {
            return false;
        }
        done += n as usize;
    }
    true
}

/// The page ranges the loader made read-only after relocation, of every loaded object.
fn relro_regions() -> Vec<(usize, usize)> {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        out: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: the loader passes a valid info for each object and `out` is the Vec below.
        let (info, out) = unsafe { (&*info, &mut *(out as *mut Vec<(usize, usize)>)) };
        if info.dlpi_phdr.is_null() {
            return 0;
        }
        // SAFETY: dlpi_phdr points at dlpi_phnum program headers.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        for ph in phdrs {
            if ph.p_type == libc::PT_GNU_RELRO {
                // As the loader rounds it (glibc's _dl_protect_relro): both ends down.
                let page = 4096usize;
                let from = (info.dlpi_addr as usize + ph.p_vaddr as usize) & !(page - 1);
                let to = (info.dlpi_addr as usize + ph.p_vaddr as usize + ph.p_memsz as usize)
                    & !(page - 1);
                if to > from {
                    out.push((from, to - from));
                }
            }
        }
        0
    }
    let mut out: Vec<(usize, usize)> = Vec::new();
    // SAFETY: the callback only reads what the loader hands it and appends to `out`.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut out as *mut _ as *mut libc::c_void) };
    out
}

/// # Safety
/// `[start, start + len)` must be a mapped, read-only region that nothing writes.
unsafe fn replace_with_memfd(start: usize, len: usize) {
    // SAFETY: plain syscalls on a descriptor this function owns; the final mmap replaces the
    // region with the same bytes (see the caller).
    unsafe {
        let fd = libc::memfd_create(
            c"stsd-relro".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        );
        if fd < 0 {
            return;
        }
        if !write_all(fd, start, len) {
            libc::close(fd);
            return;
        }
        if libc::fcntl(fd, libc::F_ADD_SEALS, FINAL) != 0 {
            libc::close(fd);
            return;
        }
        let at = libc::mmap(
            start as *mut libc::c_void,
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_FIXED,
            fd,
            0,
        );
        libc::close(fd);
        if at != start as *mut libc::c_void {
            // The old mapping may be gone: this process cannot go on. The supervisor makes
            // another zygote (and reports it if that one fails too).
            libc::_exit(70);
        }
    }
}

/// The zygote, after its start and first context: makes fork copy the page-table entries of
/// its code mappings, and returns where its heap begins (for [`own_heap_while_idle`]). A
/// mapping that refuses (a policy forbidding writable code, say) is left as it was: each
/// worker then faults its pages in.
pub fn prepare() -> Option<usize> {
    let maps = mappings();
    for m in &maps {
        // Code only: read-only data is mostly touched once, at start (sharing its entries too
        // would double an idle worker's proportional memory for a few faults a call).
        let code = &m.perms == b"r-xp";
        if !code || !m.path.starts_with('/') || m.end <= m.start {
            continue;
        }
        // Huge-page code (huge_code) is mapped by each worker with a fault per 2 MiB block;
        // an anonymous page would split the block it lands in.
        if m.path.starts_with(HUGE_CODE_MAPPING) {
            continue;
        }
        let (addr, len) = (m.start as *mut libc::c_void, m.end - m.start);
        let p = libc::PROT_READ | libc::PROT_EXEC;
        // SAFETY: the range is a whole mapping of this process, as the kernel listed it. It
        // is made writable only for the one write below, which stores back the byte that is
        // already there (the process is single-threaded: nothing reads it in between), and
        // its protection is then restored. The code running here may sit in the range: it
        // stays executable throughout and its bytes never change.
        unsafe {
            if libc::mprotect(addr, len, p | libc::PROT_WRITE) != 0 {
                continue;
            }
            let b = addr as *mut u8;
            std::ptr::write_volatile(b, std::ptr::read_volatile(b));
            if libc::mprotect(addr, len, p) != 0 {
                // Dropping a right cannot fail where adding it did not; if it ever did, no
                // worker may inherit writable code: end the zygote (the supervisor makes
                // another, and reports it if that one fails too).
                libc::_exit(70);
            }
        }
    }
    // The heap's end is the program break at the time of each fork.
    maps.iter().find(|m| m.path == "[heap]").map(|m| m.start)
}

/// How long (ms) a forked worker waits for work before it owns its heap pages.
pub const IDLE_BEFORE_OWNING: i32 = 10;

/// A forked worker, after it said Ready, when no work has come for [`IDLE_BEFORE_OWNING`]:
/// writes each page of its heap once, a chunk at a time, so that its private copies are made
/// in time nobody waits for. `start` is what [`prepare`] returned in the zygote;
/// `work_within(ms)` waits up to `ms` for work to arrive (0: only looks) and says whether it
/// has; it is asked before each chunk, so work never waits for more than one chunk.
///
/// A worker given work soon after its start (under load every one is: an urgent fork, or a
/// pool worker primed straight away) copies just the pages it writes, when it writes them:
/// copying every page before Ready, whether the worker would write it or not, cost each worker
/// about 150 µs of CPU here, which calls at one after another paid for in primed workers that
/// were not ready yet (one-shot, interleaved: `stats-summary` p50 0.647 -> 0.595 ms, CPU per
/// call 1587 -> 1480 µs). A worker that waits longer (a quiet daemon) owns its heap before
/// its call, so that a call that is not primed (a tool with a file-system grant, or one that
/// needs approval) does not take some 50 copy-on-write faults, about 100 µs, on its path.
pub fn own_heap_while_idle(start: Option<usize>, work_within: impl Fn(i32) -> bool) {
    let Some(start) = start else { return };
    if work_within(IDLE_BEFORE_OWNING) {
        return;
    }
    let work_waiting = || work_within(0);
    // SAFETY: sbrk(0) only reads the current break.
    let end = unsafe { libc::sbrk(0) } as usize;
    const PAGE: usize = 4096;
    const CHUNK: usize = 16 * PAGE;
    let mut at = start;
    while at < end && !work_waiting() {
        let len = CHUNK.min(end - at);
        // One call makes the chunk's private copies without a page-fault exception per
        // page. Kernels before 5.14 answer EINVAL: then one write per page does the same.
        // SAFETY: [at, at + len) lies in [start, break), this process's heap, mapped
        // read-write; populating it writes no byte of it.
        let populated =
            unsafe { libc::madvise(at as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) } == 0;
        if !populated {
            let mut p = at;
            while p < at + len {
                // SAFETY: as above; the byte is read and stored back unchanged, and the
                // process is single-threaded.
                unsafe {
                    let b = p as *mut u8;
                    std::ptr::write_volatile(b, std::ptr::read_volatile(b));
                }
                p += PAGE;
            }
        }
        at += len;
    }
}

/// The largest request glibc's per-thread cache holds (its default `tcache_max`).
const TCACHE_MAX_REQUEST: usize = 1032;

/// The zygote, once, before its first fork: takes every free chunk glibc's heap holds (its
/// bins and the thread's cache) and keeps them for good, so that a worker's allocations come
/// from the top of the heap, packed into pages of its own, rather than from free chunks
/// scattered over the pages it shares with the zygote, each copied on the worker's first write
/// there (glibc placing blocks was about 23 of a worker's 94 page faults a call). A worker never
/// writes the chunks taken here. Returns how many were taken.
///
/// A free chunk lies below the top chunk, whose start is the program break less the top's
/// size (glibc's own count, `mallinfo2`). So this holds for the main arena only, that of a
/// single-threaded process such as the zygote, whose heap starts at `heap_start` (what
/// [`prepare`] returned); an allocation outside `[heap_start, top)` ends the taking. Each
/// request size is asked for until one comes from the top, which is given back: a large one
/// joins the top again, a small one waits in the thread's cache at the top's start, where a
/// worker's first allocations write anyway. Last, the top is trimmed to the program break's
/// minimum: an idle worker makes its whole heap its own ([`own_heap_while_idle`]), and the
/// free top the probes left would add some 75 KiB to each.
pub fn take_free_chunks(heap_start: Option<usize>) -> usize {
    let Some(heap_start) = heap_start else {
        return 0; // no heap mapped: nothing to take
    };
    // glibc >= 2.33; every field is a size_t (the layout is C's: most are not read here).
    #[repr(C)]
    #[allow(dead_code)]
    struct Mallinfo2 {
        arena: usize,
        ordblks: usize,
        smblks: usize,
        hblks: usize,
        hblkhd: usize,
        usmblks: usize,
        fsmblks: usize,
        uordblks: usize,
        fordblks: usize,
        keepcost: usize,
    }
    extern "C" {
        fn mallinfo2() -> Mallinfo2;
    }
    // Where the top chunk starts, and the free bytes in the bins (fordblks counts the top too).
    let state = || {
        // SAFETY: mallinfo2 only reads the allocator's state; sbrk(0) only reads the break.
        let (m, brk) = unsafe { (mallinfo2(), libc::sbrk(0) as usize) };
        (
            brk.saturating_sub(m.keepcost),
            m.fordblks.saturating_sub(m.keepcost),
        )
    };
    let mut taken = 0;
    // Large requests halve down to 1 KiB; then every small size glibc's cache and small bins
    // hold (chunks of 32 to 1040 bytes), which also takes what the large ones split off. An
    // iterator, not a list: a list would be allocated in a hole and freed back into it.
    let sizes = (0..7)
        .map(|i| (64usize << 10) >> i)
        .chain((1..=63).rev().map(|k| k * 16));
    for size in sizes {
        let (top, binned) = state();
        // The thread's cache (requests up to 1032 bytes) is not in mallinfo2's count.
        if size > TCACHE_MAX_REQUEST && binned < size {
            continue; // no free chunk is this large: the request would come from the top
        }
        loop {
            // SAFETY: a plain allocation, kept for the process's life (never freed). Through
            // black_box: an allocation nothing uses may be removed by the compiler, and this
            // loop would then never end.
            let p = std::hint::black_box(unsafe { libc::malloc(size) });
            if p.is_null() {
                return taken;
            }
            // From the top (or a merge of free chunks into it), or from outside the heap (not
            // the main arena): this size is done.
            if (p as usize) < heap_start || (p as usize).saturating_add(size) > top {
                // SAFETY: allocated just above, freed once.
                unsafe { libc::free(p) };
                break;
            }
            taken += 1;
        }
    }
    // SAFETY: gives free memory at the top of the heap back; no pointer is passed. Nothing is
    // left in the bins for it to release besides.
    unsafe { libc::malloc_trim(0) };
    taken
}
