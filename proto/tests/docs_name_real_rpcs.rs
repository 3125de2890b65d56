//! Every rpc the documentation names exists in the `.proto` files: `Gateway.X`,
//! `WorkerGateway.X`, and "gRPC `X` stream" in `docs/*.md` and the README.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::Path;

/// The rpc names declared in every `.proto` file (`rpc Name(`).
fn declared_rpcs(root: &Path) -> Vec<String> {
    let dir = root.join("proto/proto/switchyard/v1");
    let mut rpcs = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in text.lines() {
            if let Some(rest) = line.trim_start().strip_prefix("rpc ") {
                let name: String = rest
                    .chars()
                    .take_while(char::is_ascii_alphanumeric)
                    .collect();
                rpcs.push(name);
            }
        }
    }
    rpcs
}

/// The rpc names a document mentions, with the line they are on.
fn named_rpcs(text: &str) -> Vec<(usize, String)> {
    let mut named = Vec::new();
    for (number, line) in text.lines().enumerate() {
        for prefix in ["`Gateway.", "`WorkerGateway.", "gRPC `"] {
            for (at, _) in line.match_indices(prefix) {
                let rest = &line[at + prefix.len()..];
                let name: String = rest
                    .chars()
                    .take_while(char::is_ascii_alphanumeric)
                    .collect();
                let closed = rest[name.len()..].starts_with('`');
                let is_stream = prefix != "gRPC `" || rest[name.len()..].starts_with("` stream");
                if !name.is_empty() && closed && is_stream {
                    named.push((number + 1, name));
                }
            }
        }
    }
    named
}

#[test]
fn every_rpc_the_docs_name_is_declared() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let rpcs = declared_rpcs(&root);
    assert!(rpcs.iter().any(|rpc| rpc == "ConnectWorker"), "{rpcs:?}");
    let mut documents = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        // Only the Markdown pages: docs/ also holds pictures (the console's screenshot).
        if path.extension().is_some_and(|extension| extension == "md") {
            documents.push(path);
        }
    }
    let mut checked = 0;
    for document in documents {
        let text = std::fs::read_to_string(&document).unwrap();
        for (line, name) in named_rpcs(&text) {
            checked += 1;
            assert!(
                rpcs.contains(&name),
                "{}:{line} names rpc `{name}`, which no .proto declares",
                document.display()
            );
        }
    }
    assert!(checked > 0, "no rpc names found in the docs");
}

#[test]
fn the_scanner_finds_a_misnamed_stream() {
    // Control: the sentence the architecture page used to carry is caught.
    let found = named_rpcs("A worker opens a gRPC `Connect` stream and `Gateway.Dispatch`.");
    assert_eq!(
        found,
        vec![(1, "Dispatch".to_owned()), (1, "Connect".to_owned())]
    );
}
