"""What forge knows about each sort of service state: one subpackage per kind, listed in ``registry``."""
