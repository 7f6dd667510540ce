import arviz as az
import pytest

from pyro_flat.cli import main


def test_demo_writes_every_file(tmp_path):
    out = tmp_path / "run"
    code = main(["demo", "--num-samples", "60", "--warmup", "40", "--chains", "1",
                 "--n-train", "400", "--dim", "5", "--out", str(out)])
    assert code == 0
    for name in ("entropy_sgld.nc", "trace.png", "report.md", "report.json"):
        assert (out / name).stat().st_size > 0
    idata = az.from_netcdf(str(out / "entropy_sgld.nc"))
    assert idata.posterior["w"].shape == (1, 60, 5) and "w_aux" in idata.posterior
    assert "coupling_distance" in idata.sample_stats


@pytest.mark.parametrize("flag,value,needle", [
    ("--eta", "0", "--eta must be > 0"),
    ("--step-size", "-1", "--step-size must be > 0"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, flag, value, needle):
    assert main(["demo", flag, value, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and err.count("\n") == 1


def test_out_is_a_file(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["demo", "--out", str(f)]) == 2
    assert "is a file" in capsys.readouterr().err
