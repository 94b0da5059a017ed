"""What a finished run reads like: the end-of-run table (`sparring.report.summary`) and
``sparring report``'s plots and tables (`sparring.report.plots`), both from
``metrics.jsonl``."""
