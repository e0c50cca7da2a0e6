from ordnmf_dask.app.cli import main

raise SystemExit(main())
