"""What the rocketlake DAGs share: settings, the lake's Assets, the Spark task factory.

Not a DAG file (``.airflowignore`` keeps the DAG processor out of it); the DAG folder is on
``sys.path`` wherever Airflow parses or runs the DAGs, so the DAG files import it by name. It only
imports Airflow: everything that needs the project's own libraries (PySpark, delta-rs) runs in the
project's virtualenv, through ``spark-submit`` or an ``ExternalPythonOperator``.
"""
