//! Link-time layout of the `stsd` binary.
//!
//! Its code segment is placed on a 2 MiB boundary (of the file and of the address space, which
//! the kernel keeps when it loads the binary: it aligns the load address to the largest
//! segment alignment). The zygote can then hand its workers every 2 MiB block of code as one
//! huge page (`worker/src/inherit.rs`, `huge_code`) instead of about a thousand page-table
//! entries each. Without it only the blocks that happen to lie whole inside the segment can be.
fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if os == "linux" && (arch == "x86_64" || arch == "aarch64") {
        // separate-code starts the code segment on a max-page-size boundary of its own.
        println!("cargo:rustc-link-arg-bins=-Wl,-z,max-page-size=0x200000");
        println!("cargo:rustc-link-arg-bins=-Wl,-z,separate-code");
    }
}
