//! JavaScript strings to Rust strings without loss. A JS string is UTF-16 and may hold a lone
//! surrogate (half an emoji); a Rust string cannot. QuickJS hands such a string out as WTF-8
//! (the surrogate encoded as if it were a code point), which `rquickjs::String::to_string`
//! refuses. Here each lone surrogate becomes the six characters `JSON.stringify` writes for it
//! (`\ud83d`), so console lines, errors and results keep it visibly instead of failing.

/// `s` as a Rust string, lone surrogates written as `\uXXXX` (lowercase, as JSON.stringify).
pub fn lossless(s: &rquickjs::String<'_>) -> rquickjs::Result<String> {
    let c = s.clone().to_cstring()?;
    // SAFETY: `c` owns the engine's C string of `c.len()` bytes and outlives this borrow; no
    // JavaScript runs while it is read.
    let bytes = unsafe { std::slice::from_raw_parts(c.as_ptr().cast::<u8>(), c.len()) };
    Ok(from_wtf8(bytes))
}

/// WTF-8 bytes to a string: a surrogate's three-byte form (ED A0..BF 80..BF) becomes its
/// `\uXXXX` escape; anything else that is not UTF-8 becomes U+FFFD.
pub fn from_wtf8(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    let (mut start, mut i) = (0, 0);
    while i < bytes.len() {
        // 0xED is a lead byte, never a continuation byte, so a byte-wise scan cannot land
        // inside a valid sequence.
        if bytes[i] == 0xED
            && i + 2 < bytes.len()
            && (0xA0..=0xBF).contains(&bytes[i + 1])
            && (0x80..=0xBF).contains(&bytes[i + 2])
        {
            out.push_str(&String::from_utf8_lossy(&bytes[start..i]));
            let unit =
                0xD000 | (u32::from(bytes[i + 1] & 0x3F) << 6) | u32::from(bytes[i + 2] & 0x3F);
            out.push_str(&format!("\\u{unit:04x}"));
            i += 3;
            start = i;
        } else {
            i += 1;
        }
    }
    out.push_str(&String::from_utf8_lossy(&bytes[start..]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lone_surrogates_become_escapes() {
        assert_eq!(from_wtf8(b"a\xED\xA0\xBDb"), "a\\ud83db");
        assert_eq!(from_wtf8(b"\xED\xB8\x80"), "\\ude00");
        assert_eq!(from_wtf8("é😀".as_bytes()), "é😀");
        // A truncated or foreign byte is U+FFFD, not a panic.
        assert_eq!(from_wtf8(b"x\xED\xA0"), "x\u{FFFD}\u{FFFD}");
        assert_eq!(from_wtf8(b"\xFF"), "\u{FFFD}");
    }

    #[test]
    fn engine_strings_round_trip() {
        let rt = rquickjs::Runtime::new().unwrap_or_else(|_| unreachable!());
        let ctx = rquickjs::Context::full(&rt).unwrap_or_else(|_| unreachable!());
        ctx.with(|ctx| {
            let s: rquickjs::String = ctx
                .eval(r#""x\ud83d" + "\ude00y" + "\ud83d\ude00".slice(1)"#)
                .unwrap_or_else(|_| unreachable!());
            assert_eq!(lossless(&s).ok().as_deref(), Some("x😀y\\ude00"));
        });
    }
}
