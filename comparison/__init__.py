"""What compare.py is made of: the matrix of runs, the report, the plots and
the projection past one machine."""
