from pipelines.storage import Location
def test_fixture(s3_server):
    b = s3_server.new_bucket()
    loc = Location.parse(f"s3://{b}/x", s3_server.options)
    loc.child("f").write_bytes(b"hello")
    assert loc.child("f").read_range(1, 3) == b"ell"
    assert loc.is_dir() and not Location.parse(f"s3://{b}/y", s3_server.options).is_dir()
