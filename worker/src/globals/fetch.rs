//! `fetch` on the host side: the request goes to the supervisor's broker as frames on the
//! worker's socket, and the worker blocks until the answer arrives. The worker itself has no
//! network: its seccomp profile refuses socket(2) for every domain but the one it inherited.

use super::host::bytes_of;
use crate::channel::Channel;
use rquickjs::{ArrayBuffer, Ctx, Function, Object, TypedArray};
use std::rc::Rc;
use stsd_protocol::frames::{FetchRequest, FromWorker, ToWorker, CHUNK_BYTES};
use stsd_protocol::Code;

use super::helper_error as fail;

/// The class of the error the tool sees; codes the broker may not use become HELPER_RUNTIME.
fn kind_of(code: &str) -> &'static str {
    match Code::parse(code) {
        Some(Code::Security) => "SECURITY",
        Some(Code::InvalidInput) => "INVALID_INPUT",
        _ => "HELPER_RUNTIME",
    }
}

thread_local! {
    /// The broker's channel, for signing with a withheld secret (set with `fetch`: a posture
    /// without network has no broker to ask).
    static SIGNER: std::cell::RefCell<Option<Rc<Channel>>> = const { std::cell::RefCell::new(None) };
}

/// HMAC with a key only the supervisor holds (`placeholder` stands for it): Err is the
/// message for the tool.
pub fn hmac_withheld(hash: &str, placeholder: &str, data: &[u8]) -> Result<Vec<u8>, String> {
    let Some(ch) = SIGNER.with(|s| s.borrow().clone()) else {
        return Err("sign: a key from a withheld secret signs only in a tool with network (the supervisor holds it)".into());
    };
    ch.send(&FromWorker::Hmac {
        hash: hash.to_string(),
        placeholder: placeholder.to_string(),
        data: data.to_vec(),
    })?;
    match ch.recv()? {
        ToWorker::HmacDone { mac, error: None } => Ok(mac),
        ToWorker::HmacDone { error: Some(e), .. } => Err(e),
        other => Err(format!("sign: unexpected frame {other:?}")),
    }
}

struct Answer {
    head: stsd_protocol::frames::FetchHead,
    body: Vec<u8>,
}

fn exchange(ch: &Channel, req: FetchRequest, body: &[u8]) -> Result<Answer, (String, String)> {
    let broken = |e: String| ("HELPER_RUNTIME".to_string(), format!("[fetch] broker: {e}"));
    for chunk in body.chunks(CHUNK_BYTES) {
        ch.send(&FromWorker::FetchBody {
            data: chunk.to_vec(),
        })
        .map_err(broken)?;
    }
    ch.send(&FromWorker::Fetch(Box::new(req))).map_err(broken)?;
    let head = match ch.recv().map_err(broken)? {
        ToWorker::FetchHead(h) => *h,
        ToWorker::FetchFailed { code, message } => return Err((code, message)),
        other => return Err(broken(format!("unexpected frame {other:?}"))),
    };
    let mut body = Vec::with_capacity(head.body_len.min(16 << 20) as usize);
    loop {
        match ch.recv().map_err(broken)? {
            ToWorker::FetchBody { data, last } => {
                body.extend_from_slice(&data);
                if body.len() as u64 > head.body_len {
                    return Err(broken("more body than announced".into()));
                }
                if last {
                    break;
                }
            }
            other => return Err(broken(format!("unexpected frame {other:?}"))),
        }
    }
    Ok(Answer { head, body })
}

/// `{fetch, decode}` for fetch.js. `fetch(url, method, headers [[k, v]...], body
/// string|ArrayBuffer|undefined, startIndex, maxLength|undefined)` -> `{status, statusText, url,
/// headers, truncated, nextStartIndex, body}`; failures throw `KIND: message`. `decode(buf)`
/// is lossy UTF-8 (a response's `text()`).
pub fn host_object<'js>(ctx: &Ctx<'js>, channel: Rc<Channel>) -> rquickjs::Result<Object<'js>> {
    SIGNER.with(|s| *s.borrow_mut() = Some(channel.clone()));
    let o = Object::new(ctx.clone())?;
    o.set("fetch", fetch_function(ctx, channel)?)?;
    o.set(
        "decode",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>, b: TypedArray<'js, u8>| -> rquickjs::Result<String> {
                Ok(String::from_utf8_lossy(&bytes_of(&ctx, &b)?).into_owned())
            },
        )?,
    )?;
    Ok(o)
}

fn fetch_function<'js>(ctx: &Ctx<'js>, channel: Rc<Channel>) -> rquickjs::Result<Function<'js>> {
    Function::new(
        ctx.clone(),
        move |ctx: Ctx<'js>,
              url: String,
              method: String,
              headers: Vec<Vec<String>>,
              body: rquickjs::Value<'js>,
              start_index: f64,
              max_length: Option<f64>|
              -> rquickjs::Result<Object<'js>> {
            let mut pairs = Vec::with_capacity(headers.len());
            for h in headers {
                match <[String; 2]>::try_from(h) {
                    Ok([k, v]) => pairs.push((k, v)),
                    Err(_) => {
                        return Err(fail(
                            &ctx,
                            "INVALID_INPUT",
                            "[fetch] a header must be a [name, value] pair",
                        ))
                    }
                }
            }
            let body: Vec<u8> = if let Some(s) = body.as_string() {
                s.to_string()?.into_bytes()
            } else if let Some(b) = body
                .as_object()
                .and_then(|o| TypedArray::<u8>::from_object(o.clone()).ok())
            {
                bytes_of(&ctx, &b)?
            } else {
                Vec::new()
            };
            let req = FetchRequest {
                url,
                method,
                headers: pairs,
                body_len: body.len() as u64,
                start_index: start_index.max(0.0) as u64,
                max_length: max_length.map(|n| n.max(0.0) as u64),
            };
            let a = exchange(&channel, req, &body)
                .map_err(|(code, msg)| fail(&ctx, kind_of(&code), msg))?;
            let o = Object::new(ctx.clone())?;
            o.set("status", a.head.status)?;
            o.set("statusText", a.head.status_text)?;
            o.set("url", a.head.url)?;
            let hs: Vec<Vec<String>> = a
                .head
                .headers
                .into_iter()
                .map(|(k, v)| vec![k, v])
                .collect();
            o.set("headers", hs)?;
            o.set("truncated", a.head.truncated)?;
            o.set("nextStartIndex", a.head.next_start_index.map(|n| n as f64))?;
            o.set("body", ArrayBuffer::new_copy(ctx.clone(), &a.body)?)?;
            Ok(o)
        },
    )
}
