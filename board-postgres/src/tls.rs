//! TLS to the server. `sslmode=require` in a board's URL encrypts every
//! connection of every process (dispatcher, worker, an agent's call) and
//! verifies the server's certificate and host name: against the CA
//! certificates of `sslrootcert=PATH` (PEM), or the web's public roots
//! (Mozilla's, bundled) without it. Any other `sslmode` (the default is
//! `prefer`) connects in the clear, as libpq's does with a server that
//! offers no TLS; there is no mode that encrypts without verifying.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use kanban_core::BoardError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// Makes verified TLS connections to a board's server.
#[derive(Clone)]
pub(crate) struct Verified(Arc<rustls::ClientConfig>);

impl std::fmt::Debug for Verified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Verified")
    }
}

impl Verified {
    /// Trusting the CA certificates in `root_cert`, or the public roots.
    pub(crate) fn trusting(root_cert: Option<&Path>) -> Result<Self, BoardError> {
        let unusable = |message: String| BoardError::Unusable {
            path: "--db".to_owned(),
            message,
        };
        let mut roots = rustls::RootCertStore::empty();
        match root_cert {
            Some(path) => {
                let certificates = CertificateDer::pem_file_iter(path)
                    .and_then(|found| found.collect::<Result<Vec<_>, _>>())
                    .map_err(|error| {
                        unusable(format!(
                            "sslrootcert {} cannot be read as PEM certificates ({error}); give the file of the CA that signed the server's certificate",
                            path.display()
                        ))
                    })?;
                let (added, _) = roots.add_parsable_certificates(certificates);
                if added == 0 {
                    return Err(unusable(format!(
                        "sslrootcert {} holds no CA certificate; give the file of the CA that signed the server's certificate",
                        path.display()
                    )));
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|error| unusable(format!("TLS cannot be set up: {error}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(Self(Arc::new(config)))
    }
}

impl<S> MakeTlsConnect<S> for Verified
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Stream<S>;
    type TlsConnect = Connect;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, host: &str) -> Result<Connect, Self::Error> {
        // A host name or an IP address, as the certificate must name it.
        let name = ServerName::try_from(host.to_owned())?;
        Ok(Connect {
            connector: tokio_rustls::TlsConnector::from(self.0.clone()),
            name,
        })
    }
}

/// One connection's handshake.
pub(crate) struct Connect {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for Connect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Stream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Stream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            self.connector
                .connect(self.name, stream)
                .await
                .map(|tls| Stream(Box::new(tls)))
        })
    }
}

/// A connection under TLS.
pub(crate) struct Stream<S>(Box<tokio_rustls::client::TlsStream<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Stream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Stream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for Stream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        // SCRAM's channel binding is not offered; the certificate is
        // verified instead, which binds the channel to the server.
        ChannelBinding::none()
    }
}
