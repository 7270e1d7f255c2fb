//! The control plane's certificates and kubeconfigs, made with openssl.

use super::*;

/// The files every client needs: the CA and one kubeconfig per identity.
#[derive(Debug, Clone)]
pub struct Credentials {
    /// The cluster CA (signed the API server's serving certificate); the `ca.crt` of Pods.
    pub ca: PathBuf,
    /// The testbed as controller (`system:masters`).
    pub admin_kubeconfig: PathBuf,
    /// The testbed as kubelet (`system:node:<node>`).
    pub kubelet_kubeconfig: PathBuf,
}

pub(super) fn openssl(dir: &Path, args: &[&str]) -> Result<(), NetError> {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| NetError(format!("cannot run openssl (install it): {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetError(format!(
            "`openssl {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

pub(super) fn write(path: &Path, text: &str) -> Result<(), NetError> {
    std::fs::write(path, text).map_err(|e| NetError(format!("{}: {e}", path.display())))
}

/// A fresh random token (hex, from the kernel's random source).
pub(super) fn token() -> Result<String, NetError> {
    let mut buf = [0u8; 16];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| NetError(format!("/dev/urandom: {e}")))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

pub(super) fn kubeconfig(server: &str, ca: &Path, user: &str, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: testbed\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: testbed\n  context:\n    cluster: testbed\n    user: {user}\ncurrent-context: testbed\n",
        ca.display()
    )
}

/// Generates the PKI in `dir/pki`: CA, the API server's serving certificate (for the node's
/// addresses, 127.0.0.1, the `kubernetes` Service IP and names), the ServiceAccount key pair,
/// the static token file, and a kubeconfig per identity.
pub(super) fn pki(dir: &Path) -> Result<(Credentials, PathBuf), NetError> {
    let pki = dir.join("pki");
    std::fs::create_dir_all(&pki).map_err(|e| NetError(format!("{}: {e}", pki.display())))?;
    keys_and_certificates(&pki)?;
    let ca = pki.join("ca.crt");
    let local = format!("https://127.0.0.1:{API_PORT}");
    let (admin, kubelet, kcm, proxy) = (token()?, token()?, token()?, token()?);
    write(
        &pki.join("tokens.csv"),
        &format!(
            "{admin},lameduck-testbed,lameduck-testbed,\"system:masters\"\n\
             {kubelet},system:node:{NODE_NAME},system:node:{NODE_NAME},\"system:nodes\"\n\
             {kcm},system:kube-controller-manager,system:kube-controller-manager\n\
             {proxy},system:kube-proxy,system:kube-proxy\n"
        ),
    )?;
    let creds = Credentials {
        ca: ca.clone(),
        admin_kubeconfig: pki.join("admin.kubeconfig"),
        kubelet_kubeconfig: pki.join("kubelet.kubeconfig"),
    };
    write(
        &creds.admin_kubeconfig,
        &kubeconfig(&local, &ca, "lameduck-testbed", &admin),
    )?;
    write(
        &creds.kubelet_kubeconfig,
        &kubeconfig(&local, &ca, "kubelet", &kubelet),
    )?;
    write(
        &pki.join("kcm.kubeconfig"),
        &kubeconfig(&local, &ca, "kube-controller-manager", &kcm),
    )?;
    write(
        &pki.join("proxy.kubeconfig"),
        &kubeconfig(&local, &ca, "kube-proxy", &proxy),
    )?;
    // The kube-proxies of the other nodes reach the API across the fabric, at the address it
    // advertises (in its certificate).
    write(
        &pki.join("proxy-remote.kubeconfig"),
        &kubeconfig(
            &format!("https://{NODE_CLIENT_IP}:{API_PORT}"),
            &ca,
            "kube-proxy",
            &proxy,
        ),
    )?;
    Ok((creds, pki))
}

/// The CA, the API server's serving certificate and the ServiceAccount key pair, made with
/// `openssl` in `pki`.
fn keys_and_certificates(pki: &Path) -> Result<(), NetError> {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let mut ca_args = vec!["req", "-x509", "-nodes", "-days", "2"];
    ca_args.extend_from_slice(&ec);
    ca_args.extend_from_slice(&[
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=lameduck-testbed-ca",
    ]);
    openssl(pki, &ca_args)?;
    let mut csr_args = vec!["req", "-nodes"];
    csr_args.extend_from_slice(&ec);
    csr_args.extend_from_slice(&[
        "-keyout",
        "apiserver.key",
        "-out",
        "apiserver.csr",
        "-subj",
        "/CN=kube-apiserver",
    ]);
    openssl(pki, &csr_args)?;
    write(
        &pki.join("apiserver.ext"),
        &format!(
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:{NODE_CLIENT_IP},IP:127.0.0.1,IP:{KUBERNETES_SERVICE_IP},DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost\n"
        ),
    )?;
    openssl(
        pki,
        &[
            "x509",
            "-req",
            "-in",
            "apiserver.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "apiserver.ext",
            "-out",
            "apiserver.crt",
        ],
    )?;
    openssl(
        pki,
        &[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-out",
            "sa.key",
        ],
    )?;
    openssl(pki, &["pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub"])?;

    Ok(())
}
