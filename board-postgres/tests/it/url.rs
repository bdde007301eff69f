//! Board URLs: what a claim carries reads back as the same board, and TLS
//! settings that would not do what they seem are refused by name.

use kanban_board_postgres::{parse_url, public_url};

#[test]
fn a_public_url_reads_back_as_the_same_board_whatever_its_names_hold() {
    for url in [
        "postgres://kanban@db.example:6543/boards",
        "postgres://a%40b%3Ac@%2Fvar%2Frun%2Fpostgres%20sock:5433/x%2Fy%3Fz",
        "postgres://k@[::1]:5432/k",
        "postgres://%C3%A9l%C3%A8ve@localhost/d%C3%A9p%C3%B4t",
    ] {
        let parsed = parse_url(url).unwrap();
        let again = parse_url(&public_url(&parsed)).unwrap();
        let (config, again) = (&parsed.config, &again.config);
        assert_eq!(again.get_user(), config.get_user(), "{url}");
        assert_eq!(again.get_hosts(), config.get_hosts(), "{url}");
        assert_eq!(again.get_ports(), config.get_ports(), "{url}");
        assert_eq!(again.get_dbname(), config.get_dbname(), "{url}");
    }
    let odd = parse_url("postgres://a%40b@%2Ftmp%2Fpg:5433/x%2Fy").unwrap();
    assert_eq!(odd.config.get_user(), Some("a@b"));
    assert_eq!(public_url(&odd), "postgres://a%40b@%2Ftmp%2Fpg:5433/x%2Fy");
}

#[test]
fn tls_settings_read_back_and_the_root_certificate_is_named_absolutely() {
    use tokio_postgres::config::SslMode;
    let dir = std::env::temp_dir().join(format!("kanban-tls-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("a b")).unwrap();
    let ca = dir.join("a b").join("ca.pem");
    std::fs::write(&ca, "").unwrap();
    let given = format!(
        "postgres://k@db.example:5432/k?sslmode=require&sslrootcert={}&connect_timeout=3",
        ca.display().to_string().replace(' ', "%20")
    );
    let parsed = parse_url(&given).unwrap();
    assert_eq!(parsed.config.get_ssl_mode(), SslMode::Require);
    assert_eq!(parsed.root_cert.as_deref(), Some(ca.as_path()));
    assert_eq!(
        parsed.config.get_connect_timeout(),
        Some(&std::time::Duration::from_secs(3)),
        "the other parameters reach the driver"
    );
    let public = public_url(&parsed);
    assert!(
        public.contains("/k?sslmode=require&sslrootcert=%2F"),
        "{public}"
    );
    let again = parse_url(&public).unwrap();
    assert_eq!(again.root_cert, parsed.root_cert);
    assert_eq!(again.config.get_ssl_mode(), SslMode::Require);
    assert_eq!(public_url(&again), public);
    // Without TLS asked for, the URL is as before.
    let plain = parse_url("postgres://k@db.example:5432/k?sslmode=disable").unwrap();
    assert_eq!(public_url(&plain), "postgres://k@db.example:5432/k");
    // A root certificate that is not there is named.
    let missing = parse_url("postgres://k@h/k?sslmode=require&sslrootcert=/nonexistent/ca.pem")
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains("sslrootcert /nonexistent/ca.pem cannot be read"),
        "{missing}"
    );
    // Settings that would not do what they seem are refused by name.
    for (given, said) in [
        (
            "postgres://k@h/k?sslrootcert=/etc/ca.pem",
            "without sslmode=require",
        ),
        (
            "postgres://k@h/k?sslmode=prefer&sslrootcert=/etc/ca.pem",
            "without sslmode=require",
        ),
        (
            "postgres://k@h/k?sslmode=require&sslrootcert=",
            "an empty sslrootcert",
        ),
        ("postgres://k@%2Ftmp/k?sslmode=require", "on a Unix socket"),
        (
            "postgres://k@h/k?sslmode=require&sslrootcert=%FF%FE",
            "not UTF-8",
        ),
    ] {
        let error = parse_url(given).unwrap_err().to_string();
        assert!(error.contains(said), "{given}: {error}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
