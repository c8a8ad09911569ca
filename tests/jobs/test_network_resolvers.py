"""A job in its own network namespace is given name servers it can reach."""

from jobs import network, sandbox


def _conf(path, *servers):
    path.write_text("".join(f"nameserver {server}\n" for server in servers) + "options edns0\n")
    return path


def test_a_node_behind_systemd_resolved_gives_its_jobs_the_upstream_servers(tmp_path):
    """Ubuntu's /etc/resolv.conf names only systemd-resolved's stub, 127.0.0.53, which a job's own network
    namespace cannot reach: a team allowed the internet could resolve no name. The stub's upstream list is what
    the job reads, and what its egress rules let through."""
    stub = _conf(tmp_path / "resolv.conf", "127.0.0.53")
    upstream = _conf(tmp_path / "upstream.conf", "10.0.0.2", "10.0.0.3")
    assert network.job_resolv_conf(stub, upstream=upstream) == upstream
    assert network.node_resolvers(network.job_resolv_conf(stub, upstream=upstream)) == (
        "10.0.0.2",
        "10.0.0.3",
    )


def test_a_node_naming_reachable_servers_gives_its_jobs_its_own_file(tmp_path):
    own = _conf(tmp_path / "resolv.conf", "127.0.0.53", "192.0.2.53")
    upstream = _conf(tmp_path / "upstream.conf", "10.0.0.2")
    assert network.job_resolv_conf(own, upstream=upstream) == own
    assert network.job_resolv_conf(
        _conf(tmp_path / "stub.conf", "127.0.0.53"), upstream=tmp_path / "none"
    ) == (tmp_path / "stub.conf")


def test_the_job_sees_the_chosen_file_as_its_resolv_conf(tmp_path, monkeypatch):
    chosen = _conf(tmp_path / "upstream.conf", "10.0.0.2")
    monkeypatch.setattr(network, "job_resolv_conf", lambda *args, **kwargs: chosen)
    view = sandbox._system_view()
    bind = view.index("/etc/resolv.conf") - 1
    assert view[bind - 1 : bind + 2] == ["--ro-bind", str(chosen), "/etc/resolv.conf"]
