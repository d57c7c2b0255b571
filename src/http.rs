//! What every outgoing HTTP client shares: parsing the URLs people configure (http or https, a
//! host, nothing else). A leaf module: `coder/`, `gpu/` and `audit` use it, it uses nothing of
//! this crate but `error`.

use reqwest::Url;

use crate::error::Error;

/// Parses an `http://` or `https://` URL with a host; anything else is a configuration error
/// naming `setting` and an example of what to write instead.
pub fn http_url(setting: &str, raw: &str, example: &str) -> Result<Url, Error> {
    let raw = raw.trim();
    let bad = || Error::config(format!("{setting} {raw:?} is not an http(s) URL: pass e.g. {example}"));
    let url = Url::parse(raw).map_err(|_| bad())?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(bad());
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_http_urls_with_a_host() {
        assert!(http_url("--x", "https://coder.example.com", "e").is_ok());
        for bad in ["coder.example.com", "dns+http://coder:80", "ftp://x", "http://", "unix:///run/x.sock"] {
            let e = http_url("--x", bad, "https://e").unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}");
            assert!(e.message().starts_with("--x "), "{e}");
        }
    }
}
