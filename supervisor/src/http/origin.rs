//! The `Origin` header, normalised for comparison (RFC 6454: scheme, host, port; the
//! scheme's default port made explicit; case folded). `null` stays `null`.

/// `scheme://host:port` in lower case, or `null`; None when it is not an origin.
pub fn normalize(origin: &str) -> Option<String> {
    let o = origin.trim();
    if o.eq_ignore_ascii_case("null") {
        return Some("null".into());
    }
    let url = url::Url::parse(o).ok()?;
    // An origin has no path, query, fragment or credentials.
    if !matches!(url.path(), "" | "/")
        || url.query().is_some()
        || url.fragment().is_some()
        || !url.username().is_empty()
    {
        return None;
    }
    let host = url.host_str()?.to_ascii_lowercase();
    let port = url.port_or_known_default()?;
    Some(format!("{}://{host}:{port}", url.scheme()))
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn origins_compare_by_scheme_host_and_port() {
        assert_eq!(
            normalize("https://App.Example.com"),
            Some("https://app.example.com:443".into())
        );
        assert_eq!(
            normalize("https://app.example.com:443"),
            normalize("https://app.example.com")
        );
        assert_ne!(
            normalize("http://app.example.com"),
            normalize("https://app.example.com")
        );
        assert_eq!(normalize("null"), Some("null".into()));
        assert_eq!(normalize("https://a.example/path"), None);
        assert_eq!(normalize("not an origin"), None);
    }
}
