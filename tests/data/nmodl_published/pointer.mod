TITLE Three-state AMPA receptor driven by a POINTER to another mechanism's transmitter

COMMENT
Written for kingen's tests in the style of published ModelDB files (not a copy of one): the
transmitter concentration is a POINTER set from a release mechanism; a PROCEDURE with C code
in VERBATIM prints a message and feeds nothing of the scheme.
ENDCOMMENT

NEURON {
    POINT_PROCESS AMPAPTR
    RANGE kon, koff, kd, kr, g, gmax
    NONSPECIFIC_CURRENT i
    POINTER glu
}

UNITS {
    (nA) = (nanoamp)
    (mV) = (millivolt)
    (pS) = (picosiemens)
    (mM) = (milli/liter)
}

PARAMETER {
    Erev = 0 (mV)
    gmax = 15 (pS)
    kon = 10 (/mM /ms)
    koff = 3 (/ms)
    kd = 0.5 (/ms)
    kr = 0.05 (/ms)
}

ASSIGNED {
    v (mV)
    i (nA)
    g (pS)
    glu (mM)
}

STATE { R O D }

INITIAL {
    R = 1
}

BREAKPOINT {
    SOLVE kin METHOD sparse
    g = gmax * O
    i = (1e-6) * g * (v - Erev)
}

KINETIC kin {
    ~ R <-> O (kon*glu, koff)
    ~ O <-> D (kd, kr)
    CONSERVE R + O + D = 1
}

PROCEDURE hello() {
VERBATIM
    printf("AMPAPTR ready\n");
ENDVERBATIM
}
