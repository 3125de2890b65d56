//! The `switchyard` binary.
#![forbid(unsafe_code)]

fn main() {
    println!("switchyard: the gateway is being assembled; see README.md");
}
