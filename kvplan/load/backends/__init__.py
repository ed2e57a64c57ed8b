"""Where a load level's requests run (kvplan.load.driver.Backend): ``engine`` (the bundled engine,
in this process)."""
