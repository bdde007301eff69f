//! The mail channel of notifications: one message per notification,
//! through the subscription's SMTP server, always over TLS (STARTTLS, or
//! TLS from the start), its password from the dispatcher's environment or
//! an owner-only file.

use std::time::Duration;

use kanban_core::EventRecord;
use kanban_core::notify::{self, Attempt, Delivery};
use lettre::message::header::ContentType;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{Message, SmtpTransport, Transport as _};

/// How long one SMTP exchange may take.
const SMTP_TIMEOUT: Duration = Duration::from_secs(20);

/// Sends one notification; what the attempt came to, and why it failed.
pub(crate) fn send(
    delivery: &Delivery,
    event: &EventRecord,
    id: &str,
    body: &str,
    link: Option<&str>,
    password: Option<String>,
) -> (Attempt, String) {
    match try_send(delivery, event, id, body, link, password) {
        Ok(()) => (Attempt::Delivered, String::new()),
        Err(failure) => failure,
    }
}

fn try_send(
    delivery: &Delivery,
    event: &EventRecord,
    id: &str,
    body: &str,
    link: Option<&str>,
    password: Option<String>,
) -> Result<(), (Attempt, String)> {
    let refused = |why: String| (Attempt::Refused, why);
    let Some(smtp) = &delivery.smtp else {
        return Err(refused("the subscription names no SMTP server".to_owned()));
    };
    let server = notify::parse_smtp_server(&smtp.server).map_err(refused)?;
    let mut text = notify::summary_line(event, &delivery.card, link);
    text.push_str("\n\n");
    text.push_str(body);
    text.push('\n');
    let domain = smtp.from.rsplit('@').next().unwrap_or("kanban");
    let message = Message::builder()
        .from(
            smtp.from
                .parse()
                .map_err(|e| refused(format!("the sender: {e}")))?,
        )
        .to(delivery
            .address
            .parse()
            .map_err(|e| refused(format!("the address: {e}")))?)
        .subject(notify::mail_subject(event, &delivery.card))
        .message_id(Some(format!("<{id}@{domain}>")))
        .header(ContentType::TEXT_PLAIN)
        .body(text)
        .map_err(|e| refused(format!("the message: {e}")))?;
    let mut tls = TlsParameters::builder(server.host.clone());
    if let Some(ca) = &smtp.ca {
        let pem = std::fs::read(ca).map_err(|e| {
            (
                Attempt::Transient,
                format!("cannot read the CA file {ca}: {e}"),
            )
        })?;
        let certificate =
            Certificate::from_pem(&pem).map_err(|e| refused(format!("the CA file {ca}: {e}")))?;
        tls = tls.add_root_certificate(certificate);
    }
    let tls = tls
        .build_rustls()
        .map_err(|e| refused(format!("TLS settings: {e}")))?;
    let mut transport = SmtpTransport::builder_dangerous(&server.host)
        .port(server.port)
        .timeout(Some(SMTP_TIMEOUT))
        .tls(if server.implicit_tls {
            Tls::Wrapper(tls)
        } else {
            Tls::Required(tls)
        });
    if let (Some(user), Some(password)) = (&server.user, password) {
        transport = transport.credentials(Credentials::new(user.clone(), password));
    }
    match transport.build().send(&message) {
        Ok(_) => Ok(()),
        Err(error) if error.is_permanent() => Err(refused(format!("SMTP: {error}"))),
        Err(error) => Err((Attempt::Transient, format!("SMTP: {error}"))),
    }
}
