//! A one-shot HTTP/1.1 GET, enough for the operations endpoints.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// GETs `path` from `addr`; returns the status code and the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let (status, _head, body) = http_get_with_head(addr, path).await?;
    Ok((status, body))
}

/// GETs `path` from `addr`; returns the status code, the head (status line and headers, as
/// sent) and the body.
pub async fn http_get_with_head(
    addr: SocketAddr,
    path: &str,
) -> std::io::Result<(u16, String, String)> {
    http_request(addr, "GET", path).await
}

/// Sends `method` `path` (no body) to `addr`; returns the status code, the head (status line
/// and headers, as sent) and the body.
pub async fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
) -> std::io::Result<(u16, String, String)> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {head:?}")))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok((status, head.to_owned(), body))
}

/// The value of the counter `name` whose labels include `label` (`key="value"`; `""` for a
/// counter without labels) on the `/metrics` of the operations listener at `addr`; 0 while the
/// series is absent.
pub async fn counter(addr: SocketAddr, name: &str, label: &str) -> std::io::Result<u64> {
    let (status, metrics) = http_get(addr, "/metrics").await?;
    if status != 200 {
        return Err(std::io::Error::other(format!("/metrics answered {status}")));
    }
    let (labelled, bare) = (format!("{name}{{"), format!("{name} "));
    Ok(metrics
        .lines()
        .find(|line| {
            (line.starts_with(&labelled) && line.contains(label))
                || (label.is_empty() && line.starts_with(&bare))
        })
        .and_then(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map_or(0, |value| value as u64))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}
