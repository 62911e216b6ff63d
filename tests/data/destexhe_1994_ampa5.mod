TITLE detailed AMPA receptor kinetic scheme (6 states)

COMMENT
Test fixture for kingen's NMODL import, written for kingen in the usual style of
ModelDB synapse files. Scheme and rate constants: Destexhe A, Mainen ZF, Sejnowski TJ
(1994) J Comput Neurosci 1:195-230, and Destexhe et al. (1998), Methods in Neuronal
Modeling, 2nd ed., MIT Press (ModelDB 18198, "ampa5"): C0 - C1 - C2 - O with
desensitized D1 (from C1) and D2 (from C2); gmax 500 pS, Erev 0 mV.
ENDCOMMENT

NEURON {
    POINT_PROCESS AMPA5
    POINTER C
    RANGE C0, C1, C2, D1, D2, O
    RANGE g, gmax, Rb, Ru1, Ru2, Rd, Rr, Ro, Rc
    GLOBAL Erev
    NONSPECIFIC_CURRENT i
}

UNITS {
    (nA) = (nanoamp)
    (mV) = (millivolt)
    (pS) = (picosiemens)
    (umho) = (micromho)
    (mM) = (milli/liter)
    (uM) = (micro/liter)
}

PARAMETER {
    Erev = 0    (mV)        : reversal potential
    gmax = 500  (pS)        : maximal conductance
    Rb   = 13   (/mM /ms)   : binding
    Ru1  = 0.0059 (/ms)     : unbinding, first site
    Ru2  = 86   (/ms)       : unbinding, second site
    Rd   = 0.9  (/ms)       : desensitization
    Rr   = 0.064 (/ms)      : resensitization
    Ro   = 2.7  (/ms)       : opening
    Rc   = 0.2  (/ms)       : closing
}

ASSIGNED {
    v   (mV)
    i   (nA)
    g   (pS)
    C   (mM)        : transmitter concentration, a pointer to the release mechanism
    rb  (/ms)
}

STATE {
    C0 C1 C2 D1 D2 O
}

INITIAL {
    C0 = 1
}

BREAKPOINT {
    SOLVE kstates METHOD sparse
    g = gmax * O
    i = (1e-6) * g * (v - Erev)
}

KINETIC kstates {
    rb = Rb * C

    ~ C0 <-> C1  (rb, Ru1)
    ~ C1 <-> C2  (rb, Ru2)
    ~ C1 <-> D1  (Rd, Rr)
    ~ C2 <-> D2  (Rd, Rr)
    ~ C2 <-> O   (Ro, Rc)

    CONSERVE C0 + C1 + C2 + D1 + D2 + O = 1
}
