//! The Rust half of the runtime globals: byte-level work done on the host with well-kept crates
//! (base64, RustCrypto, getrandom, uuid). The JavaScript half (`prelude.js`) shapes the web
//! APIs around these functions, which it receives as arguments and never puts on `globalThis`.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use rquickjs::{Ctx, Exception, Function, Object, TypedArray};
use sha1::Sha1;
use sha2::{Digest, Sha256, Sha384, Sha512};
use std::cell::Cell;
use std::rc::Rc;

// A static executable cannot find libc's getrandom(2) with dlsym, and the getrandom crates'
// fallback reads /dev/urandom through a descriptor opened once, which a worker no longer has
// when its call comes: every call would fail. .cargo/config.toml names the direct backend.
#[cfg(all(
    target_feature = "crt-static",
    not(getrandom_backend = "linux_getrandom")
))]
compile_error!(
    "a static stsd needs --cfg getrandom_backend=\"linux_getrandom\" (see .cargo/config.toml)"
);

/// WHATWG forgiving-base64's decoder: standard alphabet, non-zero trailing bits accepted
/// (`atob("SGVsbG8gV29ybGR=")` is "Hello World", as in browsers and node).
const FORGIVING_BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// Copies a Uint8Array's bytes out of the engine.
pub(crate) fn bytes_of(ctx: &Ctx<'_>, a: &TypedArray<'_, u8>) -> rquickjs::Result<Vec<u8>> {
    match a.as_raw() {
        // SAFETY: the pointer is valid while no JavaScript runs, and none runs during the copy.
        Some(p) => Ok(unsafe { p.as_ref() }.to_vec()),
        None => Err(Exception::throw_type(ctx, "the buffer is detached")),
    }
}

fn hash(alg: &str, data: &[u8]) -> Option<Vec<u8>> {
    Some(match alg {
        "SHA-1" => Sha1::digest(data).to_vec(),
        "SHA-256" => Sha256::digest(data).to_vec(),
        "SHA-384" => Sha384::digest(data).to_vec(),
        "SHA-512" => Sha512::digest(data).to_vec(),
        _ => return None,
    })
}

fn hmac(alg: &str, key: &[u8], data: &[u8]) -> Option<Vec<u8>> {
    macro_rules! mac {
        ($h:ty) => {{
            let mut m = <Hmac<$h>>::new_from_slice(key).ok()?;
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }};
    }
    Some(match alg {
        "SHA-1" => mac!(Sha1),
        "SHA-256" => mac!(Sha256),
        "SHA-384" => mac!(Sha384),
        "SHA-512" => mac!(Sha512),
        _ => return None,
    })
}

fn url_parts<'js>(ctx: &Ctx<'js>, u: &url::Url) -> rquickjs::Result<Object<'js>> {
    let o = Object::new(ctx.clone())?;
    o.set("href", url::quirks::href(u))?;
    o.set("origin", url::quirks::origin(u))?;
    o.set("protocol", url::quirks::protocol(u))?;
    o.set("username", url::quirks::username(u))?;
    o.set("password", url::quirks::password(u))?;
    o.set("host", url::quirks::host(u))?;
    o.set("hostname", url::quirks::hostname(u))?;
    o.set("port", url::quirks::port(u))?;
    o.set("pathname", url::quirks::pathname(u))?;
    o.set("search", url::quirks::search(u))?;
    o.set("hash", url::quirks::hash(u))?;
    Ok(o)
}

/// The host object handed to the prelude.
pub fn host_object<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<Object<'js>> {
    let host = Object::new(ctx.clone())?;
    host.set(
        "utf8Encode",
        Function::new(ctx.clone(), |ctx: Ctx<'js>, s: String| {
            TypedArray::<u8>::new_copy(ctx, s.as_bytes())
        })?,
    )?;
    host.set(
        "utf8Decode",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>,
             a: TypedArray<'js, u8>,
             fatal: bool,
             ignore_bom: bool|
             -> rquickjs::Result<String> {
                let bytes = bytes_of(&ctx, &a)?;
                let body = if !ignore_bom && bytes.starts_with(&[0xEF, 0xBB, 0xBF]) {
                    &bytes[3..]
                } else {
                    &bytes[..]
                };
                if fatal {
                    std::str::from_utf8(body).map(str::to_string).map_err(|_| {
                        Exception::throw_type(
                            &ctx,
                            "The encoded data was not valid for encoding utf-8",
                        )
                    })
                } else {
                    Ok(String::from_utf8_lossy(body).into_owned())
                }
            },
        )?,
    )?;
    host.set(
        "base64Encode",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>, a: TypedArray<'js, u8>| -> rquickjs::Result<String> {
                Ok(base64::engine::general_purpose::STANDARD.encode(bytes_of(&ctx, &a)?))
            },
        )?,
    )?;
    host.set(
        "base64Decode",
        // Input already normalised by web.js (forgiving-base64: whitespace gone, padding
        // restored, alphabet checked); the spec discards the last character's unused bits.
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>, s: String| -> rquickjs::Result<Option<TypedArray<'js, u8>>> {
                match FORGIVING_BASE64.decode(s.as_bytes()) {
                    Ok(b) => Ok(Some(TypedArray::<u8>::new_copy(ctx, &b)?)),
                    Err(_) => Ok(None),
                }
            },
        )?,
    )?;
    host.set(
        "randomBytes",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>, n: usize| -> rquickjs::Result<TypedArray<'js, u8>> {
                // The prelude checks 65536 too; the size is checked here, once, before any
                // allocation, whatever the caller read.
                if n > 65536 {
                    return Err(super::helper_error(
                        &ctx,
                        "INVALID_INPUT",
                        format!("getRandomValues: {n} bytes requested, the limit is 65536"),
                    ));
                }
                let mut buf = vec![0u8; n];
                getrandom::fill(&mut buf)
                    .map_err(|e| Exception::throw_internal(&ctx, &format!("getrandom: {e}")))?;
                TypedArray::<u8>::new_copy(ctx, &buf)
            },
        )?,
    )?;
    host.set(
        "randomUUID",
        Function::new(ctx.clone(), || uuid::Uuid::new_v4().to_string())?,
    )?;
    // Intl's ICU4X functions, made the first time intl.js loads (see globals/intl).
    host.set(
        "intlHost",
        Function::new(ctx.clone(), |ctx: Ctx<'js>| super::intl::host_object(&ctx))?,
    )?;
    host.set(
        "digest",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>,
             alg: String,
             a: TypedArray<'js, u8>|
             -> rquickjs::Result<TypedArray<'js, u8>> {
                let data = bytes_of(&ctx, &a)?;
                let out = hash(&alg, &data).ok_or_else(|| {
                    Exception::throw_type(&ctx, &format!("unsupported digest algorithm {alg}"))
                })?;
                TypedArray::<u8>::new_copy(ctx, &out)
            },
        )?,
    )?;
    host.set(
        "hmacWithheld",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>,
             alg: String,
             placeholder: String,
             data: TypedArray<'js, u8>|
             -> rquickjs::Result<TypedArray<'js, u8>> {
                let d = bytes_of(&ctx, &data)?;
                let out = super::fetch::hmac_withheld(&alg, &placeholder, &d)
                    .map_err(|e| Exception::throw_type(&ctx, &e))?;
                TypedArray::<u8>::new_copy(ctx, &out)
            },
        )?,
    )?;
    host.set(
        "hmac",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>,
             alg: String,
             key: TypedArray<'js, u8>,
             data: TypedArray<'js, u8>|
             -> rquickjs::Result<TypedArray<'js, u8>> {
                let (k, d) = (bytes_of(&ctx, &key)?, bytes_of(&ctx, &data)?);
                let out = hmac(&alg, &k, &d).ok_or_else(|| {
                    Exception::throw_type(&ctx, &format!("unsupported HMAC hash {alg}"))
                })?;
                TypedArray::<u8>::new_copy(ctx, &out)
            },
        )?,
    )?;
    for (name, f) in [("csvParse", 0u8), ("xmlParse", 1u8), ("yamlParse", 2u8)] {
        host.set(
            name,
            Function::new(
                ctx.clone(),
                move |ctx: Ctx<'js>,
                      text: String,
                      header: bool,
                      delim: String|
                      -> rquickjs::Result<String> {
                    let (which, r) = match f {
                        0 => ("csv", super::parser::csv(&text, header, &delim)),
                        1 => ("xml", super::parser::xml(&text)),
                        _ => ("yaml", super::parser::yaml(&text)),
                    };
                    r.map_err(|e| match e {
                        super::parser::Fail::Memory(m) => super::helper_error(
                            &ctx,
                            "MEMORY_LIMIT",
                            format!("safety.parser.{which}: {m}"),
                        ),
                        super::parser::Fail::Input(m) => Exception::throw_message(
                            &ctx,
                            &format!("INVALID_INPUT: safety.parser.{which}: {m}"),
                        ),
                    })
                },
            )?,
        )?;
    }
    // URL: WHATWG parsing and serialisation by the `url` crate. A URL travels as its href.
    host.set(
        "urlParse",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>,
             input: String,
             base: Option<String>|
             -> rquickjs::Result<Option<Object<'js>>> {
                let parsed = match base {
                    Some(b) => url::Url::parse(&b).and_then(|b| b.join(&input)),
                    None => url::Url::parse(&input),
                };
                match parsed {
                    Ok(u) => Ok(Some(url_parts(&ctx, &u)?)),
                    Err(_) => Ok(None),
                }
            },
        )?,
    )?;
    host.set(
        "urlSet",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>,
             href: String,
             field: String,
             value: String|
             -> rquickjs::Result<Object<'js>> {
                let mut u = url::Url::parse(&href)
                    .map_err(|e| Exception::throw_type(&ctx, &format!("Invalid URL: {e}")))?;
                // Setters that fail leave the URL unchanged, as the standard says.
                let _ = match field.as_str() {
                    "href" => match url::Url::parse(&value) {
                        Ok(n) => {
                            u = n;
                            Ok(())
                        }
                        Err(e) => {
                            return Err(Exception::throw_type(&ctx, &format!("Invalid URL: {e}")))
                        }
                    },
                    "protocol" => url::quirks::set_protocol(&mut u, &value),
                    "username" => url::quirks::set_username(&mut u, &value),
                    "password" => url::quirks::set_password(&mut u, &value),
                    "host" => url::quirks::set_host(&mut u, &value),
                    "hostname" => url::quirks::set_hostname(&mut u, &value),
                    "port" => url::quirks::set_port(&mut u, &value),
                    "pathname" => {
                        url::quirks::set_pathname(&mut u, &value);
                        Ok(())
                    }
                    "search" => {
                        url::quirks::set_search(&mut u, &value);
                        Ok(())
                    }
                    "hash" => {
                        url::quirks::set_hash(&mut u, &value);
                        Ok(())
                    }
                    _ => Ok(()),
                };
                url_parts(&ctx, &u)
            },
        )?,
    )?;
    host.set(
        "formParse",
        Function::new(ctx.clone(), |s: String| -> Vec<Vec<String>> {
            url::form_urlencoded::parse(s.as_bytes())
                .map(|(k, v)| vec![k.into_owned(), v.into_owned()])
                .collect()
        })?,
    )?;
    host.set(
        "formSerialize",
        Function::new(ctx.clone(), |pairs: Vec<Vec<String>>| -> String {
            let mut ser = url::form_urlencoded::Serializer::new(String::new());
            for p in pairs {
                if let [k, v] = p.as_slice() {
                    ser.append_pair(k, v);
                }
            }
            ser.finish()
        })?,
    )?;
    // The lazily loaded parts of the runtime globals (see prelude.js `load`).
    host.set(
        "compile",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>, name: String| -> rquickjs::Result<Function<'js>> {
                let Some((src, file)) = super::script(&name) else {
                    return Err(Exception::throw_type(&ctx, "unknown runtime module"));
                };
                super::script_function(&ctx, file, src)
            },
        )?,
    )?;
    Ok(host)
}

/// `Math.random`'s state: seeded from the kernel for each call's engine ([`seed_math_random`]).
/// QuickJS seeds its own once per context, from the clock; every worker forked from the
/// zygote inherits one context, so the engine's own would hand each of them the same sequence.
pub(crate) type RandomState = Rc<Cell<Option<(u64, u64)>>>;

/// Installs `Math.random` over `state`, with the runtime globals (in the zygote, before any
/// call): a state still unseeded when it is first called is seeded then.
pub(crate) fn install_math_random(ctx: &Ctx<'_>, state: &RandomState) -> rquickjs::Result<()> {
    let state = state.clone();
    let random = Function::new(ctx.clone(), move |ctx: Ctx<'_>| -> rquickjs::Result<f64> {
        let (mut s1, s0) = match state.get() {
            Some(s) => s,
            None => fresh_state().map_err(|e| Exception::throw_internal(&ctx, &e))?,
        };
        s1 ^= s1 << 23;
        s1 ^= s1 >> 17;
        s1 ^= s0 ^ (s0 >> 26);
        state.set(Some((s0, s1)));
        // 53 random bits, as a double in [0, 1).
        Ok((s0.wrapping_add(s1) >> 11) as f64 / (1u64 << 53) as f64)
    })?
    .with_name("random")?;
    let math: Object = ctx.globals().get("Math")?;
    math.set("random", random)
}

/// A call's own `Math.random` sequence, from now on.
pub(crate) fn seed_math_random(state: &RandomState) -> Result<(), String> {
    state.set(Some(fresh_state()?));
    Ok(())
}

/// xorshift128+ (the generator V8 uses) state from the kernel; it must not be all zero.
fn fresh_state() -> Result<(u64, u64), String> {
    let mut seed = [0u8; 16];
    getrandom::fill(&mut seed).map_err(|e| format!("getrandom: {e}"))?;
    let word = |b: &[u8]| {
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        u64::from_le_bytes(w)
    };
    Ok((word(&seed[..8]) | 1, word(&seed[8..])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answer_vectors() {
        let hex = |b: Vec<u8>| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        assert_eq!(
            hex(hash("SHA-256", b"abc").unwrap_or_default()),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex(hash("SHA-1", b"abc").unwrap_or_default()),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        // RFC 4231 test case 2.
        assert_eq!(
            hex(hmac("SHA-256", b"Jefe", b"what do ya want for nothing?").unwrap_or_default()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert!(hash("MD5", b"").is_none());
        // Forgiving-base64 keeps what the last character's unused bits held out.
        assert_eq!(
            FORGIVING_BASE64.decode("SGVsbG8gV29ybGR=").ok().as_deref(),
            Some(&b"Hello World"[..])
        );
    }
}
