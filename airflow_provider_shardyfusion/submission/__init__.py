"""How a sharded write reaches Spark: the PySpark bundle (``bundle``) and the spark-submit plan
(``plan``: arguments, environment and deploy-mode policy). No Airflow import: both are data."""
