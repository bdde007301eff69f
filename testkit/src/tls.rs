//! Certificates for TLS servers on loopback: a CA of the test's own and a
//! server certificate it signed for `127.0.0.1` and `localhost`, made with
//! the `openssl` program.

use std::path::{Path, PathBuf};

/// The files [`loopback_certificates`] makes.
#[derive(Clone, Debug)]
pub struct LoopbackCertificates {
    /// The CA's certificate, to trust.
    pub ca: PathBuf,
    /// The server's certificate (`server.crt`) and key (`server.key`).
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Runs `openssl` with `args` in `dir`; panics on failure.
fn openssl(dir: &Path, args: &[&str]) {
    let output = std::process::Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl runs (apt-get install openssl)");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Makes, in `dir`, a CA (`ca.pem`) and a server certificate it signed
/// for `127.0.0.1` and `localhost`, with EC keys, valid for two days.
pub fn loopback_certificates(dir: &Path) -> LoopbackCertificates {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let ca_args = [
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=kanban test CA",
    ];
    openssl(dir, &[&["req", "-x509"][..], &ec, &ca_args].concat());
    let server_args = [
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ];
    openssl(dir, &[&["req"][..], &ec, &server_args].concat());
    std::fs::write(
        dir.join("san.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .expect("write the certificate's names");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "san.cnf",
        ],
    );
    LoopbackCertificates {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
    }
}
